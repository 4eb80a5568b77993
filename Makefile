# lumen -- build the C core (liblumen.so) and the Lua cdef it is read through.
#
#   make            build/liblumen.so and lua/lumen/cdef.lua
#   make test       busted specs (under LuaJIT) + C test programs in spec/c/; one summary line
#   make asan       the same tests against an ASan/UBSan build in build-asan/
#   make amx-emu    build-amx-emu/liblumen.so: the AMX kernels over the emulated tiles (AMX_EMU=1);
#                   make test-amx-emu runs the AMX spec files against it (any AVX512_BF16 CPU)
#   make bench      bench/run.sh: lumen's benchmarks, then the PyTorch peer if it is installed
#   make lint       luacheck over the Lua tree (.luacheckrc)
#   make fuzz       build the libFuzzer harnesses (fuzz/) into build-fuzz/ and run each one for
#                   FUZZ_SECONDS (default 3600); make fuzz-ci: 20 s each (what CI runs)
#   make fuzz-build just build them
#   make demo       bin/lumen examples/demo.lua
#   make install    PREFIX=/usr/local (or luarocks' INST_* variables)
#   make clean
CC ?= cc
OPT ?= -O3 -march=x86-64-v2 -mtune=native
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fPIC -fopenmp -Isrc $(OPT)
LDFLAGS_BASE = -shared -fopenmp -lm -lz -lpthread -Wl,-z,nodelete \
   -Wl,--push-state,--no-as-needed -ljpeg -lpng -Wl,--pop-state
BUILD ?= build

# luarocks passes its own CFLAGS (-O2 -fPIC): keep the flags that matter (-fPIC, -I, -D, ...) but
# drop its -O level, which would otherwise come after OPT and override it.
ifneq ($(LUAROCKS_BUILD),)
override CFLAGS := $(filter-out -O%,$(CFLAGS))
endif

SRCS := $(wildcard src/*.c) $(wildcard src/ops/*.c) $(wildcard kernels/cpu/*.c) $(wildcard kernels/sim/*.c)
OBJS := $(patsubst %.c,$(BUILD)/%.o,$(SRCS))

# header dependencies: every object also depends on the headers it actually includes (src/iter.h,
# kernels/cpu/*.h, ...), recorded by the compiler in $(BUILD)/**/*.d (included at the end)
CFLAGS_BASE += -MMD -MP
AMX_EMU ?= 0
ifeq ($(AMX_EMU),1)
CFLAGS_BASE += -DLUMEN_AMX_EMU
endif
HDRS := src/lumen.h src/conv.h src/nn.h

NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
# the CUDA backend is built by default only where it can run: nvcc found AND an NVIDIA driver
# loaded (a GPU-less machine with the CUDA toolkit installed spends minutes in nvcc for a library
# it cannot use). CUDA=1 builds it anyway (with -Werror: CI's cuda-build stage), CUDA=0 never.
HAVE_GPU_DRIVER := $(wildcard /proc/driver/nvidia/version)
CUDA ?= $(if $(and $(NVCC),$(HAVE_GPU_DRIVER)),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDNN_HOME ?= $(CUDA_HOME)
NCCL_HOME ?= $(CUDA_HOME)
NVCC_GENCODE ?= -gencode arch=compute_90,code=[sm_90,compute_90]
CU_INC = -Isrc -Ikernels/cuda -I$(CUDNN_HOME)/include -I$(NCCL_HOME)/include
CU_LIBDIRS = $(foreach d,$(sort $(CUDA_HOME) $(CUDNN_HOME) $(NCCL_HOME)),-L$(d)/lib64 -L$(d)/lib)
# the same directories as run paths, so the library finds the CUDA libraries it was linked with
# where ld.so.conf does not list them (the loader's usual search still follows)
CU_RPATH = $(foreach d,$(sort $(CUDA_HOME) $(CUDNN_HOME) $(NCCL_HOME)),-Xlinker -rpath,$(d)/lib64 -Xlinker -rpath,$(d)/lib)
NVCC_FLAGS = -std=c++17 -O3 --extended-lambda -Xcompiler -fPIC,-Wall,-Wextra,-Werror \
   -Werror all-warnings $(NVCC_GENCODE) $(CU_INC) -MMD -MP
CU_SRCS := $(wildcard kernels/cuda/*.cu)
CU_OBJS := $(patsubst %.cu,$(BUILD)/%.o,$(CU_SRCS))
CU_EMU_OBJS := $(patsubst %.cu,$(BUILD)/emu/%.o,$(CU_SRCS))
CXX ?= g++

# ---- the ONNX writer (src/onnx/, lm.onnx.export) ----------------------------------------------
# build/liblumen_onnx.so: a small shim over Debian's protobuf-c and the code protoc-c generates
# from src/onnx/onnx.proto (the ONNX schema). Optional, like the CUDA backend: built when protoc-c
# and the protobuf-c headers are installed (ONNX=0 skips it, ONNX=1 insists), loaded by lumen only
# when lm.onnx.export runs.
PROTOC_C ?= $(shell command -v protoc-c 2>/dev/null)
PROTOBUF_C_H := $(wildcard /usr/include/protobuf-c/protobuf-c.h)
ONNX ?= $(if $(and $(PROTOC_C),$(PROTOBUF_C_H)),1,0)

all: $(BUILD)/liblumen.so lua/lumen/cdef.lua $(if $(filter 1,$(CUDA)),$(BUILD)/liblumen_cuda.so) \
   $(if $(filter 1,$(ONNX)),$(BUILD)/liblumen_onnx.so)

onnx: $(BUILD)/liblumen_onnx.so

$(BUILD)/onnx/onnx.pb-c.c $(BUILD)/onnx/onnx.pb-c.h: src/onnx/onnx.proto
	@mkdir -p $(BUILD)/onnx
	$(PROTOC_C) --proto_path=src/onnx --c_out=$(BUILD)/onnx src/onnx/onnx.proto

# the generated code is compiled as protoc-c writes it (its own warnings are not ours to fix)
$(BUILD)/liblumen_onnx.so: src/onnx/onnx_shim.c $(BUILD)/onnx/onnx.pb-c.c $(BUILD)/onnx/onnx.pb-c.h
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -fPIC -Wall -Wextra -Werror -I$(BUILD)/onnx -c \
	   src/onnx/onnx_shim.c -o $(BUILD)/onnx/onnx_shim.o
	$(CC) -std=c11 -O2 -fPIC -w -I$(BUILD)/onnx -c $(BUILD)/onnx/onnx.pb-c.c \
	   -o $(BUILD)/onnx/onnx.pb-c.o
	$(CC) -shared -o $@ $(BUILD)/onnx/onnx_shim.o $(BUILD)/onnx/onnx.pb-c.o -lprotobuf-c

$(BUILD)/liblumen.so: $(OBJS)
	$(CC) -o $@ $(OBJS) $(LDFLAGS_BASE) $(LDFLAGS)

# ISA-specific translation units: *_avx512.c and *_avx2.c get their own flags; the rest stay
# portable and pick a path at run time (CPUID).
$(BUILD)/%_avx512.o: %_avx512.c $(HDRS) src/internal.h src/backend.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c $(CFLAGS) -c $< -o $@

# AVX-512 with AVX512_BF16 (vdpbf16ps): the bfloat16 kernels; chosen at run time only when the CPU
# has it (lm_cpu_isa() == LM_ISA_AVX512_BF16)
$(BUILD)/%_avx512bf16.o: %_avx512bf16.c $(HDRS) src/internal.h src/backend.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512bf16 -mfma -mf16c $(CFLAGS) -c $< -o $@

# AMX (tiles, TDPBF16PS): the bfloat16 tile kernels, chosen at run time only when the CPU has AMX
# and Linux grants it (lm_cpu_isa() == LM_ISA_AMX; kernels/cpu/amx.h). AMX_EMU=1 (make amx-emu,
# make asan-amx-emu) builds them over the emulated tiles instead, runnable on any AVX512_BF16 machine.
$(BUILD)/%_amx.o: %_amx.c $(HDRS) src/internal.h src/backend.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512bf16 -mfma -mf16c \
	   $(if $(filter 1,$(AMX_EMU)),,-mamx-tile -mamx-bf16) $(CFLAGS) -c $< -o $@

$(BUILD)/%_avx2.o: %_avx2.c $(HDRS) src/internal.h src/backend.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -mavx2 -mfma -mf16c $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.c $(HDRS) src/internal.h src/backend.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -c $< -o $@

# ---- the CUDA backend (kernels/cuda/, docs/cuda.md) -----------------------------------------
# A second library, build/liblumen_cuda.so, which liblumen.so loads on demand (src/device.c): the
# core never links the CUDA runtime, so one build runs on machines with and without a GPU.
#   make                built when nvcc is found (PATH, or /usr/local/cuda/bin); CUDA=0 skips it,
#                       CUDA=1 insists (fails without nvcc)
#   NVCC_GENCODE        the GPUs to compile for (default: sm_90 machine code, the H100/H200, and
#                       compute_90 PTX for newer ones)
#   CUDNN_HOME, NCCL_HOME   where cudnn.h / nccl.h and their libraries are, when not in CUDA_HOME
#   make cuda-emu       build/liblumen_cuda_emu.so: the same sources as host C++ (emu.h), no GPU
#   make test-cuda-emu  the busted suite on the emulated cuda:0 (tools/run_tests.sh)
#   make test-ops-cuda-emu  spec/c/test_backend_ops.c (every op kind against the CPU, cuda:0 too)
#                       and spec/op_registry_spec.lua (the CUDA library's op-count check) with
#                       LUMEN_CUDA_LIB set to the emulated library; test-cuda-emu skips C programs

$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu $(HDRS) src/internal.h src/backend.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(BUILD)/liblumen_cuda.so: $(CU_OBJS) $(BUILD)/liblumen.so
	$(NVCC) -shared -o $@ $(CU_OBJS) -L$(BUILD) -llumen $(CU_LIBDIRS) \
	   -Xlinker -rpath,'$$ORIGIN' $(CU_RPATH) -lcudart -lcudnn -lcublasLt -lcublas

$(BUILD)/emu/kernels/cuda/%.o: kernels/cuda/%.cu $(HDRS) src/internal.h src/backend.h
	@mkdir -p $(dir $@)
	$(CXX) -x c++ -std=c++17 -DLM_CUDA_EMU -O2 -g -fPIC -Wall -Wextra -Werror -Wno-unused-parameter \
	   -Isrc -Ikernels/cuda -MMD -MP $(CUDA_EMU_FLAGS) -c $< -o $@

$(BUILD)/liblumen_cuda_emu.so: $(CU_EMU_OBJS) $(BUILD)/liblumen.so
	$(CXX) -shared -o $@ $(CU_EMU_OBJS) -L$(BUILD) -llumen -Wl,-rpath,'$$ORIGIN' $(CUDA_EMU_FLAGS)

cuda-emu: $(BUILD)/liblumen.so lua/lumen/cdef.lua $(BUILD)/liblumen_cuda_emu.so

test-cuda-emu: cuda-emu
	@$(TEST_ENV) LUMEN_LIB="$(CURDIR)/$(BUILD)/liblumen.so" \
	   LUMEN_CUDA_LIB="$(CURDIR)/$(BUILD)/liblumen_cuda_emu.so" LUMEN_TEST_DEVICE=cuda:0 \
	   bash tools/run_tests.sh $(TEST_ARGS)

test-ops-cuda-emu: cuda-emu
	@$(TEST_ENV) LUMEN_LIB="$(CURDIR)/$(BUILD)/liblumen.so" \
	   LUMEN_CUDA_LIB="$(CURDIR)/$(BUILD)/liblumen_cuda_emu.so" \
	   LUMEN_TEST_CPROGS=spec/c/test_backend_ops.c bash tools/run_tests.sh spec/op_registry_spec.lua

# the emulated CUDA backend under ASan/UBSan: every kernel body's index arithmetic runs on the host
# with bounds checking (on a GPU an out-of-range index is silent corruption), the allocator's split
# and merge too; against the ASan liblumen of `make asan`, with the suite on the emulated cuda:0
asan-cuda-emu: asan-lib
	$(MAKE) BUILD=$(ASAN_BUILD) CUDA_EMU_FLAGS="$(ASAN_FLAGS)" $(ASAN_BUILD)/liblumen_cuda_emu.so
	@$(TEST_ENV) BUILD="$(ASAN_BUILD)" LUMEN_LIB="$(CURDIR)/$(ASAN_BUILD)/liblumen.so" \
	   LUMEN_CUDA_LIB="$(CURDIR)/$(ASAN_BUILD)/liblumen_cuda_emu.so" LUMEN_TEST_DEVICE=cuda:0 \
	   LUMEN_PRELOAD="$(ASAN_RT)" \
	   ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
	   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
	   bash tools/run_tests.sh $(TEST_ARGS)

.PHONY: cuda-emu test-cuda-emu test-ops-cuda-emu asan-cuda-emu

# ---- the emulated AMX tiles (kernels/cpu/amx.h, tiles_amx.c) ---------------------------------
# AMX_EMU=1 compiles the *_amx.c kernels over tiles emulated in portable C (eight per thread, the
# palette-1 limits checked, TDPBF16PS's arithmetic) instead of the AMX instructions; the probe
# then reports LM_ISA_AMX on any AVX512_BF16 machine (Zen 4 and 5 included), so the tile kernels'
# packing, blocking and edges run, and are checked, where the CPU has no AMX.
#   make amx-emu       the library into $(AMX_EMU_BUILD)/: the normal build's objects, but for the
#                      files that AMX_EMU=1 changes (AMX_EMU_SRCS below), compiled again with it
#   make test-amx-emu  the AMX spec files (AMX_SPECS: one busted process each) and the C GEMM
#                      test and the emulation's own test (AMX_CPROGS) against it; on a CPU with
#                      AVX512_BF16, LUMEN_EXPECT_AMX=1 makes spec/amx_spec.lua fail, not pend,
#                      when the tiles are not there. A CPU without it (an AVX2 Zen 3) cannot run
#                      the emulated kernels (they are AVX512_BF16 code): there the kernel specs
#                      pend, a line says so, and the emulation's own C checks still run.
#                      TEST_ARGS=spec/x_spec.lua runs one file instead
#   make asan-amx-emu  spec/amx_spec.lua (ASAN_AMX_SPECS) and AMX_CPROGS against an ASan/UBSan
#                      build of it ($(ASAN_AMX_BUILD)/): the tile kernels' indexing bounds-checked
#                      (a CI stage of its own). Not `make asan` itself: with the emulated tiles
#                      the bfloat16 specs run 5-15 times slower under ASan (conv_bf16_spec.lua
#                      23 s -> 359 s, amx_spec.lua 9 s -> 68 s, amp_spec.lua 3.5 s -> 21 s on 2
#                      cores), where make asan keeps the AVX-512 (or real AMX) kernels
AMX_EMU_BUILD ?= build-amx-emu
ASAN_AMX_BUILD ?= build-asan-amx-emu
AMX_SPECS ?= spec/amx_spec.lua spec/conv_bf16_spec.lua spec/bf16_gemm_spec.lua
ASAN_AMX_SPECS ?= spec/amx_spec.lua
AMX_CPROGS ?= spec/c/test_bgemm.c spec/c/test_amx_emu.c
# 1 where the CPU can run the emulated tiles (AVX512_BF16), else 0 (LUMEN_EXPECT_AMX)
AMX_EMU_CPU := $(shell grep -q -w -m1 avx512_bf16 /proc/cpuinfo 2>/dev/null && echo 1 || echo 0)
define amx_emu_cpu_note
if [ "$(AMX_EMU_CPU)" != 1 ]; then echo "$(1): this CPU has no AVX512_BF16: the emulated" \
   "AMX kernels cannot run here, their specs pend; the emulation's own checks run"; fi
endef

amx-emu: $(OBJS) lua/lumen/cdef.lua
	@$(call check_amx_emu_srcs,$(BUILD))
	$(MAKE) BUILD=$(AMX_EMU_BUILD) AMX_EMU=1 $(patsubst %.c,$(AMX_EMU_BUILD)/%.o,$(AMX_EMU_SRCS))
	$(CC) -o $(AMX_EMU_BUILD)/liblumen.so $(AMX_EMU_OBJS) $(LDFLAGS_BASE) $(LDFLAGS)

test-amx-emu: amx-emu
	@$(call amx_emu_cpu_note,test-amx-emu)
	@$(TEST_ENV) BUILD="$(AMX_EMU_BUILD)" LUMEN_LIB="$(CURDIR)/$(AMX_EMU_BUILD)/liblumen.so" \
	   LUMEN_TEST_FILES="$(AMX_SPECS)" LUMEN_TEST_CPROGS="$(AMX_CPROGS)" \
	   LUMEN_EXPECT_AMX=$(AMX_EMU_CPU) \
	   bash tools/run_tests.sh $(TEST_ARGS)

# the libraries of amx-emu and asan-amx-emu: the objects of the normal build (make asan's for
# asan-amx-emu), but for the files that AMX_EMU=1 changes (those that mention LUMEN_AMX_EMU or
# include amx.h, directly or through one header), compiled again with it into $(AMX_EMU_BUILD)/
# ($(ASAN_AMX_BUILD)/): a few files instead of the whole library. check_amx_emu_srcs DIR checks
# that list against the dependency files of DIR's build (every object whose sources include
# amx.h at any depth must be in it), so that a deeper include chain cannot slip through.
AMX_EMU_HDRS := $(notdir $(shell grep -l -e LUMEN_AMX_EMU -e 'amx\.h"' kernels/cpu/*.h src/*.h 2>/dev/null))
AMX_EMU_SRCS := $(shell grep -l -e LUMEN_AMX_EMU $(foreach h,$(AMX_EMU_HDRS),-e '"$(h)"') $(SRCS) 2>/dev/null)
AMX_EMU_OBJS = $(patsubst %.c,$(AMX_EMU_BUILD)/%.o,$(AMX_EMU_SRCS)) \
   $(patsubst %.c,$(BUILD)/%.o,$(filter-out $(AMX_EMU_SRCS),$(SRCS)))
ASAN_AMX_OBJS = $(patsubst %.c,$(ASAN_AMX_BUILD)/%.o,$(AMX_EMU_SRCS)) \
   $(patsubst %.c,$(ASAN_BUILD)/%.o,$(filter-out $(AMX_EMU_SRCS),$(SRCS)))
define check_amx_emu_srcs
for d in $(patsubst %.c,$(1)/%.d,$(filter-out $(AMX_EMU_SRCS),$(SRCS))); do \
   if [ -f "$$d" ] && grep -q 'kernels/cpu/amx\.h' "$$d"; then \
      echo "make: $$d: its source includes kernels/cpu/amx.h but is not in AMX_EMU_SRCS" \
         "(an include chain deeper than AMX_EMU_HDRS finds)" >&2; exit 1; fi; \
done
endef

asan-amx-emu: asan-lib
	@$(call check_amx_emu_srcs,$(ASAN_BUILD))
	$(MAKE) BUILD=$(ASAN_AMX_BUILD) AMX_EMU=1 OPT="-O1 -g $(ASAN_FLAGS) -Wno-error" \
	   $(patsubst %.c,$(ASAN_AMX_BUILD)/%.o,$(AMX_EMU_SRCS))
	$(CC) -o $(ASAN_AMX_BUILD)/liblumen.so $(ASAN_AMX_OBJS) $(LDFLAGS_BASE) $(ASAN_FLAGS)
	@$(call amx_emu_cpu_note,asan-amx-emu)
	@$(TEST_ENV) BUILD="$(ASAN_AMX_BUILD)" LUMEN_LIB="$(CURDIR)/$(ASAN_AMX_BUILD)/liblumen.so" \
	   LUMEN_TEST_FILES="$(ASAN_AMX_SPECS)" LUMEN_TEST_CPROGS="$(AMX_CPROGS)" \
	   LUMEN_EXPECT_AMX=$(AMX_EMU_CPU) \
	   TEST_CFLAGS="$(ASAN_FLAGS)" \
	   LUMEN_PRELOAD="$(ASAN_RT)" \
	   ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
	   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
	   bash tools/run_tests.sh $(TEST_ARGS)

.PHONY: amx-emu test-amx-emu asan-amx-emu

lua/lumen/cdef.lua: $(HDRS) tools/gen_cdef.sh
	sh tools/gen_cdef.sh $(HDRS) > $@.tmp && mv $@.tmp $@

# ---- tests ------------------------------------------------------------------------------------
# tools/run_tests.sh runs busted under LuaJIT (luajit /usr/bin/busted, config in .busted), then
# builds and runs every spec/c/*.c against $(BUILD)/liblumen.so, and prints one line
# "N passed, N failed". LUMEN_LIB tells the Lua binding which library to load.
LUAJIT ?= luajit
BUSTED ?= $(shell command -v busted 2>/dev/null || echo /usr/bin/busted)
TEST_ENV = LUAJIT="$(LUAJIT)" BUSTED="$(BUSTED)" CC="$(CC)" BUILD="$(BUILD)"

test: all
	@$(TEST_ENV) LUMEN_LIB="$${LUMEN_LIB:-$(CURDIR)/$(BUILD)/liblumen.so}" bash tools/run_tests.sh $(TEST_ARGS)

# lm.distributed and DistributedDataParallel across processes (Open MPI's mpirun, 2 ranks):
# spec/mpi/, the "mpi" stage of .ci/run (docs/distributed.md)
test-mpi: all
	@$(TEST_ENV) LUMEN_LIB="$${LUMEN_LIB:-$(CURDIR)/$(BUILD)/liblumen.so}" bash tools/mpi_tests.sh

# ASan + UBSan. LuaJIT itself is not instrumented, so libasan is preloaded (LUMEN_PRELOAD becomes
# LD_PRELOAD for luajit only, not for the compiler); its leak checker is
# off because LuaJIT's own allocations are not ours to fix. -Werror is relaxed here only: the
# sanitizer instrumentation makes GCC emit extra (false-positive) warnings at -O1; the normal
# build keeps every warning an error.
ASAN_BUILD ?= build-asan
ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
ASAN_RT = $(shell $(CC) -print-file-name=libasan.so)

# make asan-lib: the library alone (.ci/run builds it once for its three ASan stages)
asan-lib:
	$(MAKE) BUILD=$(ASAN_BUILD) OPT="-O1 -g $(ASAN_FLAGS) -Wno-error" \
	   LDFLAGS="$(ASAN_FLAGS)" $(ASAN_BUILD)/liblumen.so lua/lumen/cdef.lua

asan: asan-lib
	@$(TEST_ENV) BUILD="$(ASAN_BUILD)" LUMEN_LIB="$(CURDIR)/$(ASAN_BUILD)/liblumen.so" \
	   TEST_CFLAGS="$(ASAN_FLAGS)" \
	   LUMEN_PRELOAD="$(ASAN_RT)" \
	   ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
	   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
	   bash tools/run_tests.sh $(TEST_ARGS)

# ---- benchmarks, lint, demo --------------------------------------------------------------------
bench: all
	bash bench/run.sh $(BENCH_ARGS)

lint:
	luacheck --config .luacheckrc .

demo: all
	bin/lumen examples/demo.lua

# ---- install ----------------------------------------------------------------------------------
# luarocks (build.type = "make") sets INST_PREFIX/INST_LIBDIR/INST_LUADIR/INST_BINDIR; by hand,
# PREFIX=/usr/local gives the usual Lua 5.1 locations. The libraries go into lumen/ under the C
# module folder (lib/lua/5.1/lumen/liblumen.so, liblumen_onnx.so, liblumen_cuda.so), where
# package.searchpath("lumen.liblumen", package.cpath) finds them and no top-level "liblumen"
# module is claimed; the CUDA and ONNX libraries are looked for beside liblumen.so.
PREFIX ?= /usr/local
INST_PREFIX ?= $(PREFIX)
INST_LIBDIR ?= $(INST_PREFIX)/lib/lua/5.1
INST_LUADIR ?= $(INST_PREFIX)/share/lua/5.1
INST_BINDIR ?= $(INST_PREFIX)/bin
INSTALL ?= install

install: all
	$(INSTALL) -d "$(DESTDIR)$(INST_LIBDIR)/lumen" "$(DESTDIR)$(INST_LUADIR)/lumen" "$(DESTDIR)$(INST_BINDIR)"
	$(INSTALL) -m 755 $(BUILD)/liblumen.so "$(DESTDIR)$(INST_LIBDIR)/lumen/liblumen.so"
	# the CUDA backend, only when this build asked for it (CUDA=1, or a GPU driver was found):
	# beside liblumen.so, where src/device.c looks
	$(if $(filter 1,$(CUDA)),if [ -f $(BUILD)/liblumen_cuda.so ]; then \
	   $(INSTALL) -m 755 $(BUILD)/liblumen_cuda.so "$(DESTDIR)$(INST_LIBDIR)/lumen/liblumen_cuda.so"; fi)
	if [ -f $(BUILD)/liblumen_onnx.so ]; then \
	   $(INSTALL) -m 755 $(BUILD)/liblumen_onnx.so "$(DESTDIR)$(INST_LIBDIR)/lumen/liblumen_onnx.so"; fi
	cd lua/lumen && find . -name '*.lua' | while read -r f; do \
	   $(INSTALL) -D -m 644 "$$f" "$(DESTDIR)$(INST_LUADIR)/lumen/$$f" || exit 1; done
	if ls models/*.lua >/dev/null 2>&1; then \
	   $(INSTALL) -d "$(DESTDIR)$(INST_LUADIR)/lumen/models" && \
	   $(INSTALL) -m 644 models/*.lua "$(DESTDIR)$(INST_LUADIR)/lumen/models/"; fi
	$(INSTALL) -m 755 bin/lumen "$(DESTDIR)$(INST_BINDIR)/lumen"
	$(INSTALL) -m 755 bin/lumen-run "$(DESTDIR)$(INST_BINDIR)/lumen-run"

# ---- dist -------------------------------------------------------------------------------------
# make dist: dist/lumen-X.Y.Z.tar.gz (the files git would commit: tracked, and new ones not
# ignored), dist/lumen-X.Y.Z-1.rockspec (the release rockspec with its source pointed at that
# tarball, by its absolute file:// path) and dist/lumen-X.Y.Z-1.src.rock (luarocks pack: the rockspec and the tarball in one
# file). `luarocks install lumen-X.Y.Z-1.src.rock` then builds and installs it with no network
# (spec/packaging_spec.lua does it in a temporary tree). X.Y.Z is lm._VERSION.
VERSION := $(shell sed -n 's/^lm\._VERSION = "\([^"]*\)".*/\1/p' lua/lumen/init.lua)
DIST ?= dist
DIST_NAME = lumen-$(VERSION)

dist:
	@test -n "$(VERSION)" || { echo "make dist: no lm._VERSION in lua/lumen/init.lua" >&2; exit 1; }
	@test -f rockspec/$(DIST_NAME)-1.rockspec || \
	   { echo "make dist: rockspec/$(DIST_NAME)-1.rockspec is missing" >&2; exit 1; }
	rm -rf "$(DIST)/$(DIST_NAME)" "$(DIST)/$(DIST_NAME).tar.gz" "$(DIST)/$(DIST_NAME)-1.rockspec" \
	   "$(DIST)/$(DIST_NAME)-1.src.rock"
	mkdir -p "$(DIST)/$(DIST_NAME)"
	git ls-files -co --exclude-standard -z | tar -cf - --null -T - | tar -xf - -C "$(DIST)/$(DIST_NAME)"
	tar -C "$(DIST)" -czf "$(DIST)/$(DIST_NAME).tar.gz" "$(DIST_NAME)"
	rm -rf "$(DIST)/$(DIST_NAME)"
	awk -v n="$(DIST_NAME)" -v d="$(abspath $(DIST))" \
	   'NR == 1 { print "-- made by make dist: the source is the tarball beside this file"; } \
	   /^source = \{/ { print "source = {"; \
	   print "   url = \"file://" d "/" n ".tar.gz\","; print "   dir = \"" n "\","; print "}"; \
	   skip = 1; next } \
	   skip && /^\}/ { skip = 0; next } !skip' rockspec/$(DIST_NAME)-1.rockspec \
	   > "$(DIST)/$(DIST_NAME)-1.rockspec"
	cd "$(DIST)" && luarocks pack $(DIST_NAME)-1.rockspec
	@echo "make dist: $(DIST)/$(DIST_NAME).tar.gz $(DIST)/$(DIST_NAME)-1.src.rock"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(AMX_EMU_BUILD) $(ASAN_AMX_BUILD) $(FUZZ_BUILD) lua/lumen/cdef.lua

.PHONY: all onnx test test-mpi asan asan-lib bench lint demo install clean dist

# ---- fuzzing (fuzz/README.md) ---------------------------------------------------------------
# The harnesses need clang (libFuzzer comes with libclang-rt-14-dev) and are built with
# -fsanitize=fuzzer,address,undefined. The lumen sources are compiled once more into
# $(FUZZ_BUILD)/obj with coverage instrumentation (fuzzer-no-link) and the same sanitizers and
# linked straight into every harness; -Werror is relaxed as in `make asan` (clang's instrumented
# builds warn differently), the normal build keeps it. The Lua harnesses embed LuaJIT
# (libluajit-5.1-dev) and are linked with -rdynamic so that the FFI finds lm_* in the program.
#   make fuzz                        every harness for FUZZ_SECONDS (3600) each, one after another
#   make fuzz FUZZ_TARGETS=idx FUZZ_SECONDS=600 FUZZ_JOBS=2   one harness, 2 processes (-fork)
#   make fuzz-ci                     every harness for 20 s, as .ci/run does
# FUZZ_ARGS adds libFuzzer options (e.g. -max_len=65536). fuzz/run.sh prints one line per harness
# and "N passed, N failed".
FUZZ_CC ?= clang
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 3600
FUZZ_JOBS ?= 1
FUZZ_TARGETS ?= idx idx_gz image safetensors checkpoint jit
# FUZZ_RECOVER=1 (with another FUZZ_BUILD) makes UBSan reports recoverable, so that a known one can
# be suppressed while exploring past it: UBSAN_OPTIONS=suppressions=fuzz/known-ubsan.supp
FUZZ_RECOVER ?=
FUZZ_SAN = -fsanitize=address,undefined -fno-omit-frame-pointer \
   $(if $(FUZZ_RECOVER),-fsanitize-recover=undefined,-fno-sanitize-recover=undefined)
FUZZ_CFLAGS = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unknown-pragmas -g -O1 -march=x86-64-v2 \
   -fopenmp -Isrc $(FUZZ_SAN)
FUZZ_LIBS = -fopenmp -lm -lz -ljpeg -lpng -lpthread
LUAJIT_CFLAGS ?= $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
LUAJIT_LIBS ?= $(shell pkg-config --libs luajit 2>/dev/null || echo -lluajit-5.1)
# src/ (every parser, the tensor core, the elementwise engine) is compiled once more with clang,
# coverage instrumentation (fuzzer-no-link) and the sanitizers into $(FUZZ_BUILD)/obj. The
# operator kernels (kernels/cpu/: convolution, GEMM, pooling, ...) are linked from the normal
# build instead: no parser reaches them, instrumenting them would triple the build time (ASan on
# their unrolled AVX-512 code), and two of them use a GCC-only target attribute clang refuses.
FUZZ_OBJS := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(wildcard src/*.c) $(wildcard src/ops/*.c)) \
   $(patsubst %.c,$(BUILD)/%.o,$(wildcard kernels/cpu/*.c) $(wildcard kernels/sim/*.c))
FUZZ_BINS := $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_TARGETS))

$(FUZZ_BUILD)/obj/%.o: %.c $(HDRS) src/internal.h src/backend.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: fuzz/%_fuzz.c fuzz/common.h $(FUZZ_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJS) $(FUZZ_LIBS)

$(FUZZ_BUILD)/fuzz_safetensors $(FUZZ_BUILD)/fuzz_checkpoint $(FUZZ_BUILD)/fuzz_jit: \
      $(FUZZ_BUILD)/fuzz_%: \
      fuzz/lua_fuzz.c fuzz/common.h $(FUZZ_OBJS) lua/lumen/cdef.lua
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(LUAJIT_CFLAGS) \
	   -DFUZZ_LUA_DIR='"$(CURDIR)/lua"' \
	   -DFUZZ_LUA_TARGET=$(if $(filter checkpoint,$*),2,$(if $(filter jit,$*),3,1)) -rdynamic \
	   -o $@ $< $(FUZZ_OBJS) $(LUAJIT_LIBS) $(FUZZ_LIBS)

fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build
	FUZZ_BUILD="$(FUZZ_BUILD)" FUZZ_SECONDS="$(FUZZ_SECONDS)" FUZZ_JOBS="$(FUZZ_JOBS)" \
	   FUZZ_ARGS="$(FUZZ_ARGS)" bash fuzz/run.sh $(FUZZ_TARGETS)

fuzz-ci:
	$(MAKE) fuzz FUZZ_SECONDS=20 FUZZ_JOBS=1

.PHONY: fuzz fuzz-build fuzz-ci

# last, so that `all` stays the default goal
-include $(OBJS:.o=.d) $(CU_OBJS:.o=.d) $(CU_EMU_OBJS:.o=.d)

# ---- check-peer: lumen's models against torchvision with torchvision's weights ---------------
# tools/gen_peer_models.py writes weights and reference results (PyTorch) into PEER_DIR (redone
# when the script changes), spec/peer/models_spec.lua compares lumen against them and writes
# lumen_out.safetensors, which the script's `verify` then reads back with Python.
PEER_DIR ?= /tmp/lumen-peer
PEER_PYTHON ?= /usr/bin/python3

$(PEER_DIR)/.generated: tools/gen_peer_models.py
	$(PEER_PYTHON) tools/gen_peer_models.py gen --out $(PEER_DIR)
	touch $@

check-peer: all $(PEER_DIR)/.generated
	LUMEN_PEER_DIR=$(PEER_DIR) LUMEN_LIB="$${LUMEN_LIB:-$(CURDIR)/$(BUILD)/liblumen.so}" \
	   $(LUAJIT) $(BUSTED) spec/peer/models_spec.lua
	$(PEER_PYTHON) tools/gen_peer_models.py verify --out $(PEER_DIR)

.PHONY: check-peer

# ---- check-peer-families: issue 40's model families against torchvision ----------------------
# tools/gen_peer_families.py writes weights and references into PEER_FAMILIES_DIR (~400 MB, redone
# when the script changes); spec/model_families_spec.lua compares lumen against them.
PEER_FAMILIES_DIR ?= /tmp/lumen-peer-families
PEER_TORCH_PYTHON ?= $(HOME)/.cache/lumen-peer-torch2/bin/python

$(PEER_FAMILIES_DIR)/.generated: tools/gen_peer_families.py
	$(PEER_TORCH_PYTHON) tools/gen_peer_families.py gen --out $(PEER_FAMILIES_DIR)

check-peer-families: all $(PEER_FAMILIES_DIR)/.generated
	LUMEN_PEER_FAMILIES_DIR=$(PEER_FAMILIES_DIR) \
	   LUMEN_LIB="$${LUMEN_LIB:-$(CURDIR)/$(BUILD)/liblumen.so}" \
	   $(LUAJIT) $(BUSTED) spec/model_families_spec.lua

.PHONY: check-peer-families
