#!/usr/bin/env bash
# tools/gpu_check.sh -- the one prepared run on a lent GPU machine (an H200, 16 cores, no network,
# no LuaJIT/busted: they come as Debian packages in .dev/debs). It never stops at the first
# failure: every step runs under a timeout cut to fit the time budget, logs to a file under $OUT,
# and ends as PASS / FAIL / SKIP in the SUMMARY printed at the end (also $OUT/summary.txt).
#
#   OUT=/some/dir bash tools/gpu_check.sh          (the device tool sets OUT)
#
# Steps, in this order (the figures need an idle GPU and are the issue's acceptance numbers, so
# they come right after the build; the suite is bounded by a deadline and runs files in parallel;
# the float32 model rows and the conv/pool rows are last, cut first when time runs out):
#   env     nvidia-smi, nvcc, the compilers, torch; finds cuDNN/cuBLAS/NCCL/cudart (NVIDIA's Python
#           wheels: nvidia/cudnn, nvidia/cu13, nvidia/nccl, or the toolkit) and links their
#           headers and unversioned libraries into one folder, $CUHOME (CUDNN_HOME = NCCL_HOME)
#   luajit  .dev/debs/*.deb unpacked with dpkg -x into $PREFIX (never /): LuaJIT, busted and its
#           Lua modules, and libjpeg/libpng/zlib headers and libraries for building liblumen.so
#   build   make CUDA=1 with NVCC_GENCODE sm_90 (machine code for the H200, no PTX JIT at start);
#           when it fails, once more without -Werror (the step stays FAIL, the others go on)
#   smoke   lm.cuda.is_available(), copies, elementwise, matmul, conv/pool (2-D, 3-D)/batch norm on cuda:0
#           against the CPU (a broken build shows here first), and a training step replayed from a
#           CUDA graph against the same steps taken eagerly
#   bench   ResNet50 img/s, bf16 autocast, train and infer, NHWC and NCHW, batch 64 and 256:
#           lumen (bench/cuda_models.lua, one process per row) then PyTorch on the same GPU
#           (bench/cuda_peer.py models: bench/peer_models.py, the peer's script, variant cuda_amp)
#   suite   the busted suite with tensors on cuda:0 (tools/gpu_suite.sh: tools/run_tests.sh per
#           file, files in parallel), LUMEN_ALLOW_TF32=0; the spec/cuda_*_spec.lua files included
#   bench2  the same model rows in float32 at batch 64 (lumen, PyTorch variant cuda), then the
#           conv/pool rows (bench/cuda_ops.lua, bench/cuda_peer.py ops)
# Files under $OUT (the device tool returns at most 8): env.log build.log smoke.log bench.log
# suite.log bench.tsv summary.txt.
#
# Environment (defaults in brackets): OUT [/tmp/gpu_check_out], GPU_CHECK_BUDGET seconds for the
# whole run [470], GPU_CHECK_DEBS [.dev/debs: made by tools/gpu_debs.sh], GPU_CHECK_PREFIX [/tmp/lumen-dev],
# GPU_CHECK_JOBS [nproc], GPU_CHECK_GENCODE [-gencode arch=compute_90,code=sm_90],
# GPU_CHECK_ITERS timed steps per model row [10], GPU_CHECK_BATCHES ["256 64"], GPU_CHECK_RES
# [224], GPU_CHECK_MODEL [resnet50], GPU_CHECK_OPS_BATCH [64], GPU_CHECK_SKIP (words: build,
# bench, peer, suite, bench2: steps to leave out), GPU_CHECK_PROFILE=0 (leaves out the profile step: lumen's
# LUMEN_CUDA_PROFILE table beside torch.profiler, batch GPU_CHECK_PROFILE_BATCH [256], into
# $OUT/profile.log), GPU_CHECK_SUITE_FILES (spec files instead of
# all). A local dry run (no GPU) on the emulated device:
#   make cuda-emu && LUMEN_CUDA_LIB=$PWD/build/liblumen_cuda_emu.so LUMEN_CUDA_EMU_FALLBACK=1 \
#     GPU_CHECK_BATCHES=2 GPU_CHECK_RES=32 GPU_CHECK_MODEL=resnet18 GPU_CHECK_OPS_BATCH=1 \
#     OUT=/tmp/gc bash tools/gpu_check.sh
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
T0=$(date +%s)
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT" || exit 2
BUDGET=${GPU_CHECK_BUDGET:-470}
RESERVE=10 # seconds kept for the summary
DEBS=${GPU_CHECK_DEBS:-$ROOT/.dev/debs}
PREFIX=${GPU_CHECK_PREFIX:-/tmp/lumen-dev}
JOBS=${GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 8)}
GENCODE=${GPU_CHECK_GENCODE:--gencode arch=compute_90,code=sm_90}
ITERS=${GPU_CHECK_ITERS:-10}
BATCHES=${GPU_CHECK_BATCHES:-256 64}
RES=${GPU_CHECK_RES:-224}
MODEL=${GPU_CHECK_MODEL:-resnet50}
OPS_BATCH=${GPU_CHECK_OPS_BATCH:-64}
SKIP=" ${GPU_CHECK_SKIP:-} "
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
SUM=$OUT/summary.txt
TSV=$OUT/bench.tsv
ENVLOG=$OUT/env.log BUILDLOG=$OUT/build.log SMOKELOG=$OUT/smoke.log BENCHLOG=$OUT/bench.log
SUITELOG=$OUT/suite.log
: > "$SUM"
: > "$TSV"
for f in "$ENVLOG" "$BUILDLOG" "$SMOKELOG" "$BENCHLOG" "$SUITELOG"; do : > "$f"; done

npass=0 nfail=0 nskip=0
RESULTS=()
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
note() { echo "[gpu_check $(elapsed)s] $*"; }
skipped() { case $SKIP in *" $1 "*) return 0 ;; esac; return 1; }
# record STATUS STEP DETAIL: one line of the summary
record() {
   RESULTS+=("$(printf '%-4s %-12s %4ss %s' "$1" "$2" "$(elapsed)" "$3")")
   case $1 in PASS) npass=$((npass + 1)) ;; FAIL) nfail=$((nfail + 1)) ;; *) nskip=$((nskip + 1)) ;; esac
   note "$1 $2 $3"
}
# run_to LOG CAP CMD...: CMD under `timeout`, min(CAP, the budget left) seconds, output appended
# to LOG; returns CMD's status (124: timed out) or 125 when no time is left to start it
run_to() {
   local log=$1 cap=$2 t
   shift 2
   t=$(( $(left) - RESERVE ))
   [ "$t" -gt "$cap" ] && t=$cap
   if [ "$t" -lt 10 ]; then
      echo "(not run, out of time: $*)" >> "$log"
      return 125
   fi
   echo "\$ $* [timeout ${t}s, at $(elapsed)s]" >> "$log"
   timeout -k 10 "$t" "$@" >> "$log" 2>&1
}
why() { case $1 in 124 | 137) echo "timed out" ;; 125) echo "out of time" ;; *) echo "status $1" ;; esac; }

note "start: OUT=$OUT budget ${BUDGET}s jobs $JOBS"

# ---- env -----------------------------------------------------------------------------------------
{
   echo "== date, host"; date -u; uname -a; nproc; free -g 2>/dev/null | head -2
   echo "== nvidia-smi"; timeout 30 nvidia-smi 2>&1
   timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
      --format=csv 2>&1
   echo "== compilers"; cc --version 2>&1 | head -1; c++ --version 2>&1 | head -1
   command -v dpkg ldconfig make 2>&1
   echo "== python3 / torch"; command -v python3
   timeout 60 python3 -c 'import torch, torchvision; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0), "torchvision", torchvision.__version__)' 2>&1 | tail -3
} >> "$ENVLOG" 2>&1
GPU_NAME=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

# nvcc: PATH, the toolkit, or NVIDIA's nvcc wheel
NVCC=$(command -v nvcc 2>/dev/null)
for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
   [ -z "$NVCC" ] && [ -x "$c" ] && NVCC=$c
done
# the nvidia/ namespace folders of python3's site-packages (the wheels torch uses)
NV_DIRS=$(timeout 60 python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
if [ -z "$NVCC" ]; then
   for d in $NV_DIRS; do
      c=$(find "$d" -maxdepth 4 -type f -name nvcc -path '*/bin/*' 2>/dev/null | head -1)
      [ -z "$NVCC" ] && [ -n "$c" ] && NVCC=$c
   done
fi
CUDA_HOME=${NVCC%/bin/nvcc}
{
   echo "== nvcc: ${NVCC:-NOT FOUND}"; [ -n "$NVCC" ] && "$NVCC" --version 2>&1 | tail -2
   echo "== nvidia wheel folders:"; printf '   %s\n' $NV_DIRS
} >> "$ENVLOG"
# first file named PATTERN under the wheels, then the toolkit
find_first() {
   local pat=$1 d f
   for d in $NV_DIRS "$CUDA_HOME" /usr/local/cuda /usr/lib/x86_64-linux-gnu /usr/include; do
      [ -d "$d" ] || continue
      f=$(find -L "$d" -maxdepth 4 -name "$pat" \( -type f -o -type l \) 2>/dev/null | sort | head -1)
      if [ -n "$f" ]; then echo "$f"; return 0; fi
   done
   return 1
}
# $CUHOME/include: the cuDNN and NCCL headers (cuBLAS's too when the toolkit has none);
# $CUHOME/lib: libcudnn.so, libcublas.so, ... -> the versioned files (the wheels ship only
# libcudnn.so.9 and the like, so -lcudnn would find nothing)
CUHOME=$PREFIX/cuhome
rm -rf "$CUHOME"
mkdir -p "$CUHOME/include" "$CUHOME/lib"
LIBDIRS=
env_ok=1
for h in cudnn.h nccl.h cublas_v2.h cuda_runtime.h; do
   f=$(find_first "$h")
   echo "header $h: ${f:-NOT FOUND}" >> "$ENVLOG"
   [ -z "$f" ] && { [ "$h" = cudnn.h ] || [ "$h" = cuda_runtime.h ]; } && env_ok=0
   [ -z "$f" ] && continue
   d=$(dirname "$f")
   case $h in
      cudnn.h) pat='cudnn*.h' ;;
      nccl.h) pat='nccl*.h' ;;
      cublas_v2.h) [ -f "$CUDA_HOME/include/cublas_v2.h" ] && continue; pat='cublas*.h' ;;
      *) continue ;; # the runtime's headers come with nvcc
   esac
   for g in "$d"/$pat; do [ -e "$g" ] && ln -sf "$g" "$CUHOME/include/"; done
done
for l in libcudnn libcublas libcublasLt libnccl libcudart; do
   f=$(find_first "$l.so.*[0-9]")
   [ -z "$f" ] && f=$(find_first "$l.so")
   echo "library $l: ${f:-NOT FOUND}" >> "$ENVLOG"
   if [ -z "$f" ]; then
      [ "$l" != libnccl ] && env_ok=0
      continue
   fi
   ln -sf "$f" "$CUHOME/lib/$l.so"
   case ":$LIBDIRS:" in *":$(dirname "$f"):"*) ;; *) LIBDIRS=$LIBDIRS:$(dirname "$f") ;; esac
done
# cuDNN 9 opens its engine libraries (libcudnn_engines_*.so.9, ...) from its own folder
LIBDIRS=${LIBDIRS#:}
[ -n "$CUDA_HOME" ] && LIBDIRS=$LIBDIRS:$CUDA_HOME/lib64:$CUDA_HOME/lib
{
   echo "CUHOME=$CUHOME:"; ls -l "$CUHOME/include" "$CUHOME/lib" 2>&1 | sed 's/^/   /'
   echo "library folders: $LIBDIRS"
} >> "$ENVLOG"
if [ -n "$NVCC" ] && [ $env_ok = 1 ]; then
   record PASS env "nvcc $("$NVCC" --version 2>/dev/null | grep -oE 'release [0-9.]+' | head -1), GPU: ${GPU_NAME:-none}"
else
   record FAIL env "nvcc: ${NVCC:-missing}; cuDNN/cuBLAS/cudart headers or libraries missing (env.log)"
fi

# ---- debs: LuaJIT, busted, libjpeg/libpng/zlib ---------------------------------------------------
{
   echo "== unpacking $DEBS into $PREFIX"
   mkdir -p "$PREFIX"
   n=0
   for f in "$DEBS"/*.deb; do
      [ -f "$f" ] || continue
      if command -v dpkg >/dev/null 2>&1; then
         dpkg -x "$f" "$PREFIX" || echo "dpkg -x $f failed"
      else # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
         m=$(ar t "$f" | grep '^data\.tar')
         case $m in *.xz) z=-J ;; *.zst) z=--zstd ;; *.gz) z=-z ;; *) z= ;; esac
         # shellcheck disable=SC2086
         ar p "$f" "$m" | tar -x $z -C "$PREFIX" -f - || echo "unpacking $f failed"
      fi
      n=$((n + 1))
   done
   echo "$n packages"
} >> "$ENVLOG" 2>&1
ML=$PREFIX/usr/lib/x86_64-linux-gnu
# link-time folder: the unversioned names the linker wants, pointing into the prefix (Debian's
# libz.so is an absolute link to /lib/..., which would leave the prefix)
rm -rf "$PREFIX/lnk" "$PREFIX/rt"
mkdir -p "$PREFIX/lnk" "$PREFIX/rt"
LDCONFIG=$(command -v ldconfig || ls /sbin/ldconfig /usr/sbin/ldconfig 2>/dev/null | head -1)
for pair in libjpeg.so:libjpeg.so.62 libpng.so:libpng16.so.16 libpng16.so:libpng16.so.16 libz.so:libz.so.1; do
   name=${pair%%:*} so=${pair#*:}
   f=$(ls "$ML/$so" "$PREFIX/lib/x86_64-linux-gnu/$so" 2>/dev/null | head -1)
   [ -n "$f" ] && ln -sf "$f" "$PREFIX/lnk/$name"
   # run time: the prefix's copy only when the system has none (LD_LIBRARY_PATH would shadow it)
   if [ -n "$f" ] && ! "$LDCONFIG" -p 2>/dev/null | grep -qF "$so ("; then ln -sf "$f" "$PREFIX/rt/$so"; fi
done
LUAJIT=${GPU_CHECK_LUAJIT:-$PREFIX/usr/bin/luajit}
BUSTED=${GPU_CHECK_BUSTED:-$PREFIX/usr/bin/busted}
export LUA_PATH="$PREFIX/usr/share/lua/5.1/?.lua;$PREFIX/usr/share/lua/5.1/?/init.lua;;"
export LUA_CPATH="$ML/lua/5.1/?.so;;"
# everything lumen runs with: the prefix's programs first on PATH, the CUDA libraries found above
LUMEN_LD=$PREFIX/rt:$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# (an env command, not a function: `timeout` runs it)
LENV=(env PATH="$PREFIX/usr/bin:$PATH" LD_LIBRARY_PATH="$LUMEN_LD" LUMEN_LUAJIT="$LUAJIT"
      LUAJIT="$LUAJIT" BUSTED="$BUSTED" LUMEN_LIB="$ROOT/build/liblumen.so")
lenv() { "${LENV[@]}" "$@"; }
{
   echo "== luajit: $LUAJIT; on PATH first: $(PATH="$PREFIX/usr/bin:$PATH" command -v luajit)"
   lenv "$LUAJIT" -v
   lenv "$LUAJIT" -e 'for _, m in ipairs({"busted.runner", "lfs", "pl.path", "say", "term", "system"}) do
      local ok, r = pcall(require, m)
      print(m, ok and "ok" or ("FAILED " .. tostring(r)),
            package.searchpath(m, package.path) or package.searchpath(m, package.cpath) or "")
   end'
   lenv "$LUAJIT" "$BUSTED" --version
   echo "== link folder"; ls -l "$PREFIX/lnk" "$PREFIX/rt"
} >> "$ENVLOG" 2>&1
if lenv "$LUAJIT" "$BUSTED" --version > /dev/null 2>&1; then
   record PASS luajit "$("$LUAJIT" -v 2>&1 | head -1 | cut -c1-40), busted $(lenv "$LUAJIT" "$BUSTED" --version 2>/dev/null | head -1)"
else
   record FAIL luajit "luajit/busted from $DEBS do not run (env.log)"
fi

# ---- build -----------------------------------------------------------------------------------------
if skipped build; then
   record SKIP build "GPU_CHECK_SKIP"
else
   run_to "$BUILDLOG" 300 env LD_LIBRARY_PATH="$LUMEN_LD" make -j"$JOBS" CUDA=1 NVCC="$NVCC" \
      CUDNN_HOME="$CUHOME" NCCL_HOME="$CUHOME" NVCC_GENCODE="$GENCODE" \
      CFLAGS="-I$PREFIX/usr/include -I$PREFIX/usr/include/x86_64-linux-gnu" \
      LDFLAGS="-L$PREFIX/lnk"
   rc=$?
   # A compiler newer than CI's (GCC, nvcc's host compiler) may warn where CI's did not, and every
   # warning is an error: then build once more without -Werror (C: -Wno-error after the
   # Makefile's flags; CUDA: the Makefile's NVCC_FLAGS minus its -Werror options), so that the
   # other steps still run; the build step stays FAIL.
   relaxed=0
   if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && [ $rc -ne 125 ]; then
      relaxed=1
      nvf=$(sed -n '/^NVCC_FLAGS = /,/-MMD -MP/p' Makefile | sed -e 's/^NVCC_FLAGS = //' -e 's/\\$//' |
            tr '\n' ' ' | sed -e 's/,-Werror//g' -e 's/-Werror all-warnings//g' -e 's/  */ /g')
      echo "== make failed (status $rc): once more without -Werror; NVCC_FLAGS=$nvf" >> "$BUILDLOG"
      run_to "$BUILDLOG" 200 env LD_LIBRARY_PATH="$LUMEN_LD" make -j"$JOBS" CUDA=1 NVCC="$NVCC" \
         CUDNN_HOME="$CUHOME" NCCL_HOME="$CUHOME" NVCC_GENCODE="$GENCODE" \
         CFLAGS="-I$PREFIX/usr/include -I$PREFIX/usr/include/x86_64-linux-gnu -Wno-error" \
         LDFLAGS="-L$PREFIX/lnk" NVCC_FLAGS="$nvf"
      rc2=$?
   fi
   {
      echo "== make: status $rc$([ $relaxed = 1 ] && echo ", without -Werror: $rc2") at $(elapsed)s"
      echo "== ldd build/liblumen_cuda.so (the run-time library path)"
      LD_LIBRARY_PATH="$LUMEN_LD" ldd build/liblumen_cuda.so 2>&1
      LD_LIBRARY_PATH="$LUMEN_LD" ldd build/liblumen.so 2>&1 | grep -E 'jpeg|png|libz|not found'
      command -v cuobjdump >/dev/null && cuobjdump --list-elf build/liblumen_cuda.so 2>&1 | head -5
   } >> "$BUILDLOG" 2>&1
   # compiler diagnostics ("f.c:1:2: error: ...", nvcc's "f.cu(1): warning #177-D: ...")
   nwarn=$(grep -cE '(: |^)(fatal error|error|warning)( #[0-9A-Za-z-]+)?: ' "$BUILDLOG")
   if [ $rc -eq 0 ] && [ -f build/liblumen.so ] && [ -f build/liblumen_cuda.so ]; then
      record PASS build "liblumen.so + liblumen_cuda.so ($(ls -l build/liblumen_cuda.so | awk '{print int($5 / 1024)}') KiB), $nwarn error/warning lines"
   else
      record FAIL build "make $(why $rc)$([ $relaxed = 1 ] && echo "; without -Werror: $(why $rc2)$([ $rc2 = 0 ] && echo ", steps below use that build")"); $nwarn error/warning lines; first: $(grep -m1 -E '(: |^)(fatal error|error)( #[0-9A-Za-z-]+)?: ' "$BUILDLOG" | cut -c1-150)"
   fi
fi

# ---- smoke -------------------------------------------------------------------------------------------
cat > "$WORK/smoke.lua" <<'EOF'
local lm = require("lumen")
local D = "cuda:0"
print("lumen library: " .. tostring(os.getenv("LUMEN_LIB")))
print("lm.cuda.is_available() " .. tostring(lm.cuda.is_available()) ..
      ", device_count " .. tostring(lm.cuda.device_count()))
if not lm.cuda.is_available() then
   local _, err = pcall(lm.zeros, { 1 }, { device = D })
   print("no CUDA device: " .. tostring(err))
   os.exit(3)
end
local fails = 0
-- max |a - b| / max(1, max |b|), both read back to the CPU as float64
local function rel(a, b)
   a, b = a:cpu():to(lm.float64), b:cpu():to(lm.float64)
   local d = (a - b):abs():max():item()
   return d / math.max(1, b:abs():max():item())
end
local function check(name, tol, fn)
   local ok, r = pcall(fn)
   if ok and type(r) == "number" and r > tol then ok, r = false, string.format("rel. error %.3g > %g", r, tol) end
   if not ok then fails = fails + 1 end
   print(string.format("%-4s %-40s %s", ok and "ok" or "FAIL", name,
                       type(r) == "number" and string.format("rel. error %.3g", r) or tostring(r):gsub("\n", " | ")))
   io.stdout:flush()
end
local F = lm.F
lm.manual_seed(0)
local x = lm.randn({ 4, 16, 12, 12 })
local w = lm.randn({ 32, 16, 3, 3 }) * 0.1
check("copy there and back (nchw)", 0, function() return rel(x:to(D), x) end)
check("copy keeps channels_last", 0, function()
   local y = x:contiguous(lm.channels_last):to(D)
   assert(y:is_contiguous(lm.channels_last), "format lost")
   return rel(y, x)
end)
check("add, mul, relu (elementwise)", 1e-6, function()
   local y = lm.randn({ 4, 16, 12, 12 })
   return rel(F.relu(x:to(D) * 2 + y:to(D)), F.relu(x * 2 + y))
end)
check("broadcast add nhwc + bias", 1e-6, function()
   local xc, b = x:contiguous(lm.channels_last), lm.randn({ 1, 16, 1, 1 })
   local r = xc:to(D) + b:to(D)
   assert(r:is_contiguous(lm.channels_last), "output not channels_last")
   return rel(r, xc + b)
end)
check("sum over dims (reduce)", 1e-5, function() return rel(x:to(D):sum(2), x:sum(2)) end)
check("matmul 64x96 @ 96x48", 1e-4, function()
   local a, b = lm.randn({ 64, 96 }), lm.randn({ 96, 48 })
   return rel(a:to(D):matmul(b:to(D)), a:matmul(b))
end)
check("conv2d 3x3 nchw float32", 5e-3, function()
   return rel(F.conv2d(x:to(D), w:to(D), nil, { padding = 1 }), F.conv2d(x, w, nil, { padding = 1 }))
end)
check("conv2d 3x3 nhwc float32 (format kept)", 5e-3, function()
   local xc, wc = x:contiguous(lm.channels_last), w:contiguous(lm.channels_last)
   local y = F.conv2d(xc:to(D), wc:to(D), nil, { padding = 1 })
   assert(y:is_contiguous(lm.channels_last), "output not channels_last")
   return rel(y, F.conv2d(xc, wc, nil, { padding = 1 }))
end)
check("conv2d 3x3 nhwc bfloat16", 3e-2, function()
   local xc, wc = x:contiguous(lm.channels_last):to(lm.bfloat16), w:contiguous(lm.channels_last):to(lm.bfloat16)
   return rel(F.conv2d(xc:to(D), wc:to(D), nil, { padding = 1 }), F.conv2d(xc, wc, nil, { padding = 1 }))
end)
check("conv2d backward (input, weight) nhwc", 5e-3, function()
   local function grads(dev)
      local xi = x:contiguous(lm.channels_last):to(dev)
      local wi = w:contiguous(lm.channels_last):to(dev)
      xi.requires_grad, wi.requires_grad = true, true
      F.conv2d(xi, wi, nil, { padding = 1 }):sum():backward()
      return xi.grad, wi.grad
   end
   local gx, gw = grads(D)
   local cx, cw = grads("cpu")
   return math.max(rel(gx, cx), rel(gw, cw))
end)
check("max_pool2d 3x3 s2 nhwc", 0, function()
   local xc = x:contiguous(lm.channels_last)
   local o = { kernel_size = 3, stride = 2, padding = 1 }
   return rel(F.max_pool2d(xc:to(D), o), F.max_pool2d(xc, o))
end)
check("adaptive_avg_pool2d nhwc", 1e-5, function()
   local xc = x:contiguous(lm.channels_last)
   return rel(F.adaptive_avg_pool2d(xc:to(D), { 1, 1 }), F.adaptive_avg_pool2d(xc, { 1, 1 }))
end)
check("max_pool3d 3x3x3 s2 ndhwc, indices, backward", 0, function()
   local v = lm.randn({ 2, 8, 6, 10, 10 }):contiguous(lm.channels_last_3d)
   local o = { kernel_size = 3, stride = 2, padding = 1, return_indices = true }
   local yd, id = F.max_pool3d(v:to(D), o)
   local yc, ic = F.max_pool3d(v, o)
   assert(yd:is_contiguous(lm.channels_last_3d), "output not channels_last_3d")
   local function grad(dev)
      local xi = v:to(dev):requires_grad_(true)
      F.max_pool3d(xi, { kernel_size = 3, stride = 2, padding = 1 }):sum():backward()
      return xi.grad
   end
   return math.max(rel(yd, yc), rel(id, ic), rel(grad(D), grad("cpu")))
end)
check("adaptive_avg_pool3d 1x1x1 ndhwc (video head), backward", 1e-5, function()
   local v = lm.randn({ 2, 64, 2, 7, 7 }):contiguous(lm.channels_last_3d)
   local function run(dev)
      local xi = v:to(dev):requires_grad_(true)
      local y = F.adaptive_avg_pool3d(xi, 1)
      y:sum():backward()
      return y, xi.grad
   end
   local yd, gd = run(D)
   local yc, gc = run("cpu")
   return math.max(rel(yd, yc), rel(gd, gc))
end)
check("BatchNorm2d train nhwc", 1e-4, function()
   local bn = lm.nn.BatchNorm2d(16)
   local bg = lm.nn.BatchNorm2d(16):to(D)
   local xc = x:contiguous(lm.channels_last)
   return rel(bg(xc:to(D)), bn(xc))
end)
check("cross_entropy", 1e-5, function()
   local z, t = lm.randn({ 8, 10 }), lm.randint(1, 11, { 8 })  -- 1-based classes
   return rel(F.cross_entropy(z:to(D), t:to(D)), F.cross_entropy(z, t))
end)
check("resnet18 forward b2 nhwc (eval)", 1e-2, function()
   local m = lm.models.resnet18({ num_classes = 10 })
   m:eval()
   lm.to_channels_last(m)
   local xi = lm.randn({ 2, 3, 64, 64 }):contiguous(lm.channels_last)
   local ref = lm.no_grad(function() return m(xi) end)
   m:to(D)
   return rel(lm.no_grad(function() return m(xi:to(D)) end), ref)
end)
-- CUDA graphs (kernels/cuda/graph.cu): a channels-last step (conv, batch norm, relu, linear,
-- cross entropy, capturable SGD) captured after one eager step and replayed, against the same
-- steps taken eagerly
check("CUDA graph: replayed steps = eager steps", 1e-4, function()
   local function net()
      lm.manual_seed(5)
      local m = lm.nn.Sequential(lm.nn.Conv2d(16, 8, 3, { padding = 1 }), lm.nn.BatchNorm2d(8),
                                 lm.nn.ReLU(), lm.nn.Flatten(), lm.nn.Linear(8 * 144, 10))
      return lm.to_channels_last(m):to(D)
   end
   local xs, ts = {}, {}
   for i = 1, 5 do
      xs[i] = lm.randn({ 4, 16, 12, 12 }):contiguous(lm.channels_last)
      ts[i] = lm.randint(1, 11, { 4 })
   end
   local a = net()
   local oa = lm.optim.SGD(a:parameters(), { lr = 0.05, momentum = 0.9 })
   for i = 1, 5 do
      oa:zero_grad(true)
      F.cross_entropy(a(xs[i]:to(D)), ts[i]:to(D)):backward()
      oa:step()
   end
   local b = net()
   local ob = lm.optim.SGD(b:parameters(), { lr = 0.05, momentum = 0.9, capturable = true })
   local sx, st = xs[1]:to(D), ts[1]:to(D)
   local function step()
      F.cross_entropy(b(sx), st):backward()
      ob:step()
   end
   ob:zero_grad(true)
   step()
   ob:zero_grad(true)
   local g = lm.cuda.CUDAGraph()
   lm.cuda.graph(g, step)
   for i = 2, 5 do
      sx:copy_(xs[i])
      st:copy_(ts[i])
      g:replay()
   end
   local pa, pb, r = a:parameters(), b:parameters(), 0
   for i = 1, #pa do r = math.max(r, rel(pb[i], pa[i])) end
   return r
end)
print(fails == 0 and "SMOKE OK" or ("SMOKE FAILED: " .. fails .. " checks"))
os.exit(fails == 0 and 0 or 1)
EOF
CUDA_OK=0
if [ ! -f build/liblumen.so ]; then
   record FAIL smoke "no build/liblumen.so"
else
   run_to "$SMOKELOG" 90 "${LENV[@]}" "$ROOT/bin/lumen" "$WORK/smoke.lua"
   rc=$?
   grep -q 'is_available() true' "$SMOKELOG" && CUDA_OK=1
   if [ $rc -eq 0 ]; then
      record PASS smoke "$(grep -c '^ok ' "$SMOKELOG") checks on cuda:0 against the CPU"
   elif [ $rc -eq 3 ] && [ -z "$GPU_NAME" ]; then
      record SKIP smoke "$(grep -m1 'no CUDA device' "$SMOKELOG" | cut -c1-160)"
   elif [ $rc -eq 3 ]; then # nvidia-smi sees a GPU, lumen does not: that is a failure
      record FAIL smoke "$(grep -m1 'no CUDA device' "$SMOKELOG" | cut -c1-160)"
   else
      record FAIL smoke "$(why $rc): $(grep -E '^FAIL ' "$SMOKELOG" | cut -c6-45 | sed 's/ *$//' | head -8 | tr '\n' ';')$(grep -m1 -iE 'lumen[^ ]*: |error:' "$SMOKELOG" | cut -c1-150)"
   fi
fi
TORCH_OK=0
timeout 60 python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
   > /dev/null 2>&1 && TORCH_OK=1

# ---- bench: ResNet50 img/s -------------------------------------------------------------------------
# lumen_models STEPCAP PREC "MODE FMT BATCH [graph]"...: one bench/cuda_models.lua process per row
# (a crash or a hang costs one row), at most 45 s each, all within STEPCAP seconds; "graph": the
# step captured in a CUDA graph and replayed (lm.cuda.graph)
lumen_models() {
   local cap=$1 prec=$2 t_end rc row line t
   shift 2
   t_end=$(( $(date +%s) + cap ))
   for row in "$@"; do
      set -- $row
      t=$(( t_end - $(date +%s) ))
      [ $t -gt 45 ] && t=45
      if [ $t -lt 10 ]; then
         echo "lumen $MODEL $1 $2 b$3 $prec error: not run (step time used up)" >> "$WORK/rows"
         continue
      fi
      run_to "$WORK/one.log" "$t" "${LENV[@]}" "$ROOT/bin/lumen" bench/cuda_models.lua "$1" "$2" "$3" \
         "$prec" "$ITERS" 8 "$RES" "$MODEL" cuda:0 "${4:-eager}"
      rc=$?
      line=$(grep -E "^lumen .* (img/s|error:)" "$WORK/one.log" | tail -1)
      [ -z "$line" ] && line="lumen $MODEL $1 $2 b$3 $prec${4:+ $4} error: $(why $rc), $(tail -1 "$WORK/one.log" | cut -c1-200)"
      echo "$line" >> "$WORK/rows"
      cat "$WORK/one.log" >> "$BENCHLOG"
      : > "$WORK/one.log"
      note "$line"
   done
}
torch_models() {
   local cap=$1 prec=$2 cfgs=() row
   shift 2
   for row in "$@"; do set -- $row; cfgs+=("$1,$2,$3,$prec"); done
   run_to "$WORK/peer.log" "$cap" env PYTHONUNBUFFERED=1 python3 bench/cuda_peer.py models "$ITERS" "${cfgs[@]}"
   grep -E '^torch ' "$WORK/peer.log" >> "$WORK/rows"
   grep -E '^torch ' "$WORK/peer.log" | while IFS= read -r l; do note "$l"; done
   cat "$WORK/peer.log" >> "$BENCHLOG"
   : > "$WORK/peer.log"
}
: > "$WORK/rows"
ROWS=()
for b in $BATCHES; do
   ROWS+=("train nhwc $b" "train nchw $b" "infer nhwc $b" "infer nchw $b")
done
if skipped bench; then
   record SKIP bench "GPU_CHECK_SKIP"
elif [ $CUDA_OK = 0 ]; then
   record SKIP bench-lumen "no CUDA device for lumen"
else
   echo "== lumen $MODEL bf16 autocast rows" >> "$BENCHLOG"
   lumen_models 150 amp "${ROWS[@]}"
   n=$(grep -c '^lumen .*amp img/s' "$WORK/rows")
   record "$([ "$n" -eq ${#ROWS[@]} ] && echo PASS || echo FAIL)" bench-lumen "$n of ${#ROWS[@]} bf16 autocast rows measured"
   # issue 38: the step captured in a CUDA graph, beside PyTorch eager's rows of the same batch
   gb=${BATCHES##* }
   GRAPH_ROWS=("train nhwc $gb graph" "infer nhwc $gb graph")
   echo "== lumen $MODEL bf16 autocast rows, CUDA graph" >> "$BENCHLOG"
   lumen_models 60 amp "${GRAPH_ROWS[@]}"
   n=$(grep -c '^lumen .*amp graph img/s' "$WORK/rows")
   record "$([ "$n" -eq ${#GRAPH_ROWS[@]} ] && echo PASS || echo FAIL)" bench-graph "$n of ${#GRAPH_ROWS[@]} CUDA graph rows measured"
   # the same NHWC rows with the convolutions on cuDNN's legacy API (LUMEN_CUDNN_GRAPH=0), beside
   # the default graph API's (kernels/cuda/conv_graph.cu, never run on a GPU before)
   echo "== lumen $MODEL bf16 autocast rows, cuDNN legacy API" >> "$BENCHLOG"
   for row in "train nhwc $gb" "infer nhwc $gb"; do
      set -- $row
      run_to "$WORK/one.log" 45 "${LENV[@]}" LUMEN_CUDNN_GRAPH=0 "$ROOT/bin/lumen" \
         bench/cuda_models.lua "$1" "$2" "$3" amp "$ITERS" 8 "$RES" "$MODEL"
      line=$(grep -E "^lumen .* (img/s|error:)" "$WORK/one.log" | tail -1 | sed 's/ amp / amp legacy /')
      [ -n "$line" ] && echo "$line" >> "$WORK/rows" && note "$line"
      cat "$WORK/one.log" >> "$BENCHLOG"
      : > "$WORK/one.log"
   done
fi
if skipped bench || skipped peer; then
   :
elif [ $TORCH_OK = 0 ]; then
   record SKIP bench-torch "python3's torch sees no CUDA GPU"
else
   echo "== PyTorch $MODEL bf16 autocast rows" >> "$BENCHLOG"
   torch_models 120 amp "${ROWS[@]}"
   n=$(grep -c '^torch .*amp img/s' "$WORK/rows")
   record "$([ "$n" -eq ${#ROWS[@]} ] && echo PASS || echo FAIL)" bench-torch "$n of ${#ROWS[@]} bf16 autocast rows measured"
fi

# ---- suite -------------------------------------------------------------------------------------------
if skipped suite; then
   record SKIP suite "GPU_CHECK_SKIP"
elif [ $CUDA_OK = 0 ]; then
   record SKIP suite "no CUDA device (the suite on cuda:0 needs one)"
else
   t=$(( $(left) - RESERVE - 60 )) # keep a minute for bench2
   [ $t -gt 170 ] && t=170
   # shellcheck disable=SC2086
   run_to "$SUITELOG" $((t + 20)) "${LENV[@]}" LUMEN_TEST_DEVICE=cuda:0 LUMEN_ALLOW_TF32=0 \
      SUITE_JOBS=$(( JOBS > 12 ? 12 : JOBS )) SUITE_FILE_TIMEOUT=120 \
      SUITE_DEADLINE=$(( $(date +%s) + t )) bash tools/gpu_suite.sh "$WORK/suite" ${GPU_CHECK_SUITE_FILES:-}
   rc=$?
   counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$SUITELOG" | tail -1)
   notrun=$(grep -c ' not run ' "$WORK/suite/files.txt" 2>/dev/null)
   if [ -z "$counts" ]; then
      record FAIL suite "$(why $rc) before its summary (suite.log)"
   else
      record "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" suite "$counts${notrun:+, $notrun files not run (time)}"
   fi
fi

# ---- bench2: float32 rows, conv/pool rows ---------------------------------------------------------------
FP32_ROWS=()
b64=${BATCHES##* }
FP32_ROWS=("train nhwc $b64" "train nchw $b64" "infer nhwc $b64" "infer nchw $b64")
if skipped bench2; then
   record SKIP bench2 "GPU_CHECK_SKIP"
else
   if [ $CUDA_OK = 1 ]; then
      echo "== lumen $MODEL float32 rows" >> "$BENCHLOG"
      lumen_models 70 fp32 "${FP32_ROWS[@]}"
   fi
   if [ $TORCH_OK = 1 ] && ! skipped peer; then
      echo "== PyTorch $MODEL float32 rows" >> "$BENCHLOG"
      torch_models 50 fp32 "${FP32_ROWS[@]}"
   fi
   if [ $CUDA_OK = 1 ]; then
      echo "== lumen conv/pool rows" >> "$BENCHLOG"
      run_to "$WORK/ops.log" 45 "${LENV[@]}" "$ROOT/bin/lumen" bench/cuda_ops.lua 5 "$OPS_BATCH"
      grep -E '^lumen ' "$WORK/ops.log" >> "$WORK/oprows"
      cat "$WORK/ops.log" >> "$BENCHLOG"
   fi
   if [ $TORCH_OK = 1 ] && ! skipped peer; then
      echo "== PyTorch conv/pool rows" >> "$BENCHLOG"
      run_to "$WORK/pops.log" 45 env PYTHONUNBUFFERED=1 python3 bench/cuda_peer.py ops 5 "$OPS_BATCH"
      grep -E '^torch ' "$WORK/pops.log" >> "$WORK/oprows"
      cat "$WORK/pops.log" >> "$BENCHLOG"
   fi
   n=$(grep -c 'fp32 img/s' "$WORK/rows")
   m=$(grep -cE ' (fwd|fwdbwd) [0-9.]+$' "$WORK/oprows" 2>/dev/null)
   record "$([ $CUDA_OK = 1 ] || [ $TORCH_OK = 1 ] && echo PASS || echo SKIP)" bench2 "$n float32 model rows, ${m:-0} conv/pool rows"
fi

# ---- profile: where one step's device time goes, lumen beside PyTorch ----------------------------------
# lumen: LUMEN_CUDA_PROFILE (kernels/cuda/backend.cu: every op waited for and timed, summed per op kind
# and dtype over the timed steps), once as built and once with the two paths that landed without a GPU
# run switched off (LUMEN_CUDA_BN_FAST=0: the generic batch norm; LUMEN_CUDA_CONV_GEMM=0: 1x1
# convolutions on cuDNN), plus that configuration's img/s; PyTorch: torch.profiler's CUDA time per
# kernel. Into $OUT/profile.log; GPU_CHECK_PROFILE=0 leaves the step out.
PROFLOG=$OUT/profile.log
if [ "${GPU_CHECK_PROFILE:-1}" = 1 ] && [ $CUDA_OK = 1 ]; then
   pb=${GPU_CHECK_PROFILE_BATCH:-256}
   echo "== lumen: LUMEN_CUDA_PROFILE=3 $MODEL train nhwc b$pb amp" >> "$PROFLOG"
   run_to "$PROFLOG" 90 env LUMEN_CUDA_PROFILE=3 "${LENV[@]}" "$ROOT/bin/lumen" bench/cuda_models.lua \
      train nhwc "$pb" amp 5 30 "$RES" "$MODEL"
   echo "== lumen, generic batch norm and 1x1 convolutions on cuDNN (LUMEN_CUDA_BN_FAST=0 LUMEN_CUDA_CONV_GEMM=0)" >> "$PROFLOG"
   run_to "$PROFLOG" 90 env LUMEN_CUDA_PROFILE=3 LUMEN_CUDA_BN_FAST=0 LUMEN_CUDA_CONV_GEMM=0 \
      "${LENV[@]}" "$ROOT/bin/lumen" bench/cuda_models.lua train nhwc "$pb" amp 5 30 "$RES" "$MODEL"
   run_to "$PROFLOG" 60 env LUMEN_CUDA_BN_FAST=0 LUMEN_CUDA_CONV_GEMM=0 \
      "${LENV[@]}" "$ROOT/bin/lumen" bench/cuda_models.lua train nhwc "$pb" amp 10 20 "$RES" "$MODEL"
   if [ $TORCH_OK = 1 ]; then
      echo "== PyTorch profiler, the same step" >> "$PROFLOG"
      run_to "$PROFLOG" 90 env PYTHONUNBUFFERED=1 python3 bench/cuda_torch_profile.py "$MODEL" "$pb" \
         train nhwc amp 5
   fi
   # the profiled runs' img/s are slowed by the waits; the third run is unprofiled: the figure to set
   # beside the bench step's row of the same configuration
   record PASS profile "BN_FAST=0 CONV_GEMM=0: $(grep -E '^lumen .*img/s' "$PROFLOG" | sed -n 3p | sed 's/ (.*//')"
fi

# ---- summary -------------------------------------------------------------------------------------------
# bench.tsv: impl model mode fmt batch prec img_s  (from "lumen resnet50 train nhwc b64 amp img/s N ...")
awk '$7 == "img/s" {b = $5; sub(/^b/, "", b); print $1 "\t" $2 "\t" $3 "\t" $4 "\t" b "\t" $6 "\t" $8}' \
   "$WORK/rows" > "$TSV"
awk '$(NF-1) == "fwd" || $(NF-1) == "fwdbwd" {print "op\t" $1 "\t" $2 "\t" $3 "\t" $4 "\t" $5 "\t" $6}' \
   "$WORK/oprows" >> "$TSV" 2>/dev/null
{
   # the device tool shows the last 12,000 characters of the output: the long lists come first,
   # the figures and the steps' results last
   echo "==================== SUMMARY (tools/gpu_check.sh, $(date -u +%F' '%T) UTC, $(elapsed)s) ===================="
   if [ -s "$WORK/suite/failures.txt" ]; then
      echo "suite failures (first 40 of $(wc -l < "$WORK/suite/failures.txt"); suite.log has the messages):"
      head -40 "$WORK/suite/failures.txt" | cut -c1-160 | sed 's/^/  /'
      echo
   fi
   if grep -q 'error:' "$WORK/rows"; then
      echo "benchmark rows that failed:"
      grep 'error:' "$WORK/rows" | cut -c1-200 | sed 's/^/  /'
      echo
   fi
   if grep -q '^op' "$TSV"; then
      echo "conv/pool, batch $OPS_BATCH, ms per call (t/l: torch ms / lumen ms, > 1: lumen faster)"
      awk -F'\t' '
         $1 == "op" { k = $3 " " $5 " " $6; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
                      ms[$2, $4, k] = $7 }
         function c(x) { return x == "" ? "-" : sprintf("%.3f", x) }
         function q(a, b) { return (a == "" || b == "" || a == 0) ? "-" : sprintf("%.2f", b / a) }
         END {
            printf "%-38s %8s %8s %8s %8s %6s %6s\n", "op dtype phase", "lm NCHW", "lm NHWC",
                   "pt NCHW", "pt NHWC", "t/l N", "t/l H"
            for (i = 1; i <= n; i++) { k = order[i]
               a = ms["lumen", "nchw", k]; b = ms["lumen", "nhwc", k]
               x = ms["torch", "nchw", k]; y = ms["torch", "nhwc", k]
               printf "%-38s %8s %8s %8s %8s %6s %6s\n", k, c(a), c(b), c(x), c(y), q(a, x), q(b, y) }
         }' "$TSV"
      echo
   fi
   echo "$MODEL images/s (median step after 2 warm-ups; each step ends with a device sync)"
   awk -F'\t' -v batches="$BATCHES" '
      NF == 7 && $1 != "op" { v[$1, $3, $4, $5, $6] = $7 }
      function f(x) { return x == "" ? "-" : sprintf("%.0f", x) }
      function r(a, b) { return (a == "" || b == "" || b == 0) ? "-" : sprintf("%.2f", a / b) }
      END {
         printf "%-17s %10s %10s %10s %10s %11s %12s\n", "", "lumen NHWC", "lumen NCHW", "torch NHWC",
                "torch NCHW", "lumen N/N", "lumen/torch"
         np = split("amp fp32", P, " "); nb = split(batches, B, " ")
         for (p = 1; p <= np; p++) for (m = 1; m <= 2; m++) for (i = nb; i >= 1; i--) {
            mode = m == 1 ? "train" : "infer"; b = B[i]
            ln = v["lumen", mode, "nhwc", b, P[p]]; lc = v["lumen", mode, "nchw", b, P[p]]
            tn = v["torch", mode, "nhwc", b, P[p]]; tc = v["torch", mode, "nchw", b, P[p]]
            if (ln == "" && lc == "" && tn == "" && tc == "") continue
            printf "%-17s %10s %10s %10s %10s %11s %12s\n", (P[p] == "amp" ? "bf16 " : "fp32 ") mode " b" b,
                   f(ln), f(lc), f(tn), f(tc), r(ln, lc), r(ln, tn)
         }
         print "(lumen N/N: lumen NHWC / lumen NCHW; lumen/torch: lumen NHWC / PyTorch NHWC; > 1: lumen faster)"
      }' "$TSV"
   if grep -q ' amp legacy img/s' "$WORK/rows"; then
      echo "cuDNN's graph API (the default) against its legacy API, lumen bf16 NHWC img/s:"
      awk '$7 == "legacy" && $8 == "img/s" { b = $5; sub(/^b/, "", b); l[$3 " b" b] = $9; o[++n] = $3 " b" b }
           $1 == "lumen" && $4 == "nhwc" && $6 == "amp" && $7 == "img/s" { b = $5; sub(/^b/, "", b); g[$3 " b" b] = $8 }
           END { for (i = 1; i <= n; i++) { k = o[i]
                    printf "  %-12s graph API %8s   legacy API %8.0f   graph/legacy %s\n", k,
                           (k in g) ? sprintf("%.0f", g[k]) : "-", l[k],
                           (k in g && l[k] > 0) ? sprintf("%.2f", g[k] / l[k]) : "-" } }' "$WORK/rows"
   fi
   if grep -q ' graph img/s' "$WORK/rows"; then
      echo "CUDA graphs: lumen's bf16 NHWC step replayed from one capture, beside PyTorch eager NHWC"
      echo "(issue 38 asks >= 1.2 for training at batch 64)"
      awk '$7 == "graph" && $8 == "img/s" { b = $5; sub(/^b/, "", b); k = $3 " b" b; g[k] = $9; o[++n] = k }
           $1 == "torch" && $7 == "img/s" && $4 == "nhwc" && $6 == "amp" { b = $5; sub(/^b/, "", b); t[$3 " b" b] = $8 }
           END { for (i = 1; i <= n; i++) { k = o[i]
                    printf "  %-12s lumen graph %8.0f   torch eager %8s   lumen/torch %s\n", k, g[k],
                           (k in t) ? sprintf("%.0f", t[k]) : "-",
                           (k in t && t[k] > 0) ? sprintf("%.2f", g[k] / t[k]) : "-" } }' "$WORK/rows"
   fi
   echo
   echo "GPU: ${GPU_NAME:-none}; nvcc: $NVCC; $(grep -m1 '^torch ' "$ENVLOG" 2>/dev/null | cut -c1-110)"
   printf '%s\n' "${RESULTS[@]}"
   echo "logs: $OUT/{env,build,smoke,bench,suite}.log, bench.tsv, summary.txt"
   echo "GPU_CHECK $( [ $nfail -eq 0 ] && echo PASSED || echo FAILED ): $npass passed, $nfail failed, $nskip skipped in $(elapsed)s"
} > "$SUM"
cat "$SUM"
rm -rf "$WORK"
[ $nfail -eq 0 ]
