#!/usr/bin/env bash
# Run lumen's tests and print ONE summary line: "N passed, N failed".
#
#   1. busted under LuaJIT (`luajit /usr/bin/busted --ignore-lua`, config in .busted), once per
#      spec file (spec/**/*_spec.lua) so that a crash in C costs only that file's results; with
#      arguments (spec files, --filter=..., ...) or LUMEN_TEST_SPLIT=0, one busted run instead.
#   2. every spec/c/*.c, compiled against $BUILD/liblumen.so and run. A program may print its own
#      "N passed, N failed" line (the last one counts; a non-zero exit with 0 failures adds one
#      failure); otherwise it counts as one test, passed when it exits 0.
#
# On a test device: LUMEN_TEST_DEVICE=sim:0 (any device string lumen knows: cuda:0 too, on a GPU
# or with the emulated CUDA library, `make test-cuda-emu`) runs every spec file with
# LUMEN_DEFAULT_DEVICE set to it, so the factories make their tensors there and the specs'
# values, formats and gradients are checked on that device; the C programs are skipped (they pick
# their devices themselves) and so are the host-only spec files listed in device_skip below (the
# same list for every device).
#
# busted's own summary "<n> successes / <n> failures / <n> errors / <n> pending : <t> seconds" is
# parsed: passed += successes, failed += failures + errors. A busted run that dies before printing
# its summary counts as one failure. Exit status: 0 only when nothing failed.
#
# Environment: LUAJIT (luajit), BUSTED (/usr/bin/busted), CC (cc), BUILD (build), LUMEN_LIB (the
# library the Lua binding loads), LUMEN_PRELOAD (becomes LD_PRELOAD for luajit and the C programs
# only, e.g. libasan), TEST_CFLAGS (extra flags for the C programs), LUMEN_TEST_C=0 (skip the C
# programs), LUMEN_TEST_CPROGS (the C programs to run, default every spec/c/*.c; `make
# test-amx-emu` names spec/c/test_bgemm.c), LUMEN_TEST_DEVICE (see above), LUMEN_TEST_SPLIT=0
# (a single busted process for all files), BUSTED_OPTS (options given to every busted run, e.g.
# --run=installed), LUMEN_TEST_FILES (the spec files of the split run, one busted process each;
# default every spec/**/*_spec.lua; `make test-amx-emu` names its three), LUMEN_TEST_COUNTS=FILE
# (also write "passed failed" to FILE), LUMEN_TEST_EXCLUDE=FILE (what the split run leaves out, on
# top of device_skip: .ci/run's narrowed passes, .ci/*.exclude; a line "spec/x_spec.lua" (or "spec/c/x.c") leaves
# out that file, "spec/x_spec.lua: <full test name as busted --list prints it>" that one test
# (busted --filter-out with the name as an exact pattern); # starts a comment, at the start of a
# line or after a blank),
# LUMEN_TEST_TIMES=FILE (append one line per spec
# file and C program: "<wall s> <cpu s> <name>", the CPU time being user + system of everything
# it ran; .ci/run prints the slowest of each pass). busted's output must stay plain or utf (the
# default); other output handlers (-o TAP, json) print no summary to parse.
set -u

LUAJIT=${LUAJIT:-luajit}
BUSTED=${BUSTED:-$(command -v busted || echo /usr/bin/busted)}
CC=${CC:-cc}
BUILD=${BUILD:-build}
TEST_CFLAGS=${TEST_CFLAGS:-}
PRELOAD=${LUMEN_PRELOAD:-}

cd "$(dirname "$0")/.." || exit 2
root=$(pwd)
case $BUILD in /*) build_abs=$BUILD ;; *) build_abs=$root/$BUILD ;; esac
export LUMEN_LIB=${LUMEN_LIB:-$build_abs/liblumen.so}

# Spec files about the host only, skipped under LUMEN_TEST_DEVICE (each with its reason). Every
# spec of values, formats or gradients runs there.
device_skip=(
   spec/install_spec.lua        # where the installed modules and library were loaded from
   spec/packaging_spec.lua      # the rockspec, luarocks and the launcher
   spec/repl_spec.lua           # the interactive REPL (a terminal, readline, Ctrl-C)
   spec/plot_spec.lua           # tools/plot.lua's command line and the files it writes
   spec/report_spec.lua         # bin/lumen report: a command-line tool writing files
   spec/train_example_spec.lua  # examples' command lines (they make their own tensors on the CPU)
   spec/segment_example_spec.lua  # examples/segment.lua's command line (the same)
   spec/hardening_io_spec.lua   # files: image and safetensors parsing of hostile input
   spec/data_spec.lua           # image files decoded on the host (the loader's tensors are CPU)
   spec/jit_models_spec.lua     # a fresh process reading the saved files (its tensors are CPU)
   spec/onnx_spec.lua           # ONNX files and ONNX Runtime read on the host
   spec/onnx_act_spec.lua       # the same for the issue-40 operators (its files are host memory)
   spec/onnx_resample_spec.lua  # the same for Resize, the Pad modes and ConvTranspose
   spec/onnx_index_spec.lua     # the same for the indexing operators and F.embedding
   spec/lazy_spec.lua           # the deferred elementwise engine (tensor.lua) defers CPU tensors
                                # only, by design; elsewhere every op runs eagerly, which the
                                # other specs check on the device
   spec/amx_spec.lua            # the CPU's instruction-set levels and AMX kernels (its tensors
                                # are made on the CPU; make test-amx-emu runs it emulated)
)
# ... and on a GPU (cuda:N, real or emulated) also these, about the CPU allocator's memory, which
# sim:N shares (its memory comes from lm_alloc) and a GPU does not; the device allocator's
# counters, cache and collection trigger are spec/cuda_spec.lua's
cuda_skip=(
   spec/memory_spec.lua         # lm.memory's host byte counters and collection triggers
)
is_device_skipped() {
   local s
   [ -n "$test_device" ] || return 1
   for s in "${device_skip[@]}"; do [ "$s" = "$1" ] && return 0; done
   case $test_device in
      cuda*) for s in "${cuda_skip[@]}"; do [ "$s" = "$1" ] && return 0; done ;;
   esac
   return 1
}
test_device=${LUMEN_TEST_DEVICE:-}
if [ -n "$test_device" ]; then
   export LUMEN_DEFAULT_DEVICE=$test_device
   export LUMEN_TEST_C=0
   echo "run_tests: on device $test_device (LUMEN_DEFAULT_DEVICE); C programs and host-only" \
        "spec files skipped"
fi

passed=0
failed=0
# LUMEN_TEST_TIMES: wall and CPU seconds per spec file / C program. The CPU time is read from
# this shell's own counters of the children it waited for (/proc/$$/stat: cutime + cstime, in
# clock ticks), so it needs no `time` program
clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)
child_ticks() {
   local st
   read -r -a st < /proc/$$/stat 2>/dev/null || { echo 0; return; }
   # fields 16 and 17 (cutime, cstime); comm (field 2) is "(bash)", one word
   echo $(( st[15] + st[16] ))
}
time_begin() {
   [ -n "${LUMEN_TEST_TIMES:-}" ] || return 0
   t_wall0=$(date +%s.%N)
   t_cpu0=$(child_ticks)
}
time_end() {    # time_end NAME
   [ -n "${LUMEN_TEST_TIMES:-}" ] || return 0
   local w c
   w=$(date +%s.%N)
   c=$(child_ticks)
   awk -v a="$t_wall0" -v b="$w" -v c0="$t_cpu0" -v c1="$c" -v hz="$clk_tck" -v n="$1" \
      'BEGIN { printf "%.1f %.1f %s\n", b - a, (c1 - c0) / hz, n }' >> "$LUMEN_TEST_TIMES"
}
log=$(mktemp /tmp/lumen-test.XXXXXX)
trap 'rm -f "$log" "$log.rc"' EXIT

# run CMD... with LD_PRELOAD=$PRELOAD when one is set
run_preloaded() {
   if [ -n "$PRELOAD" ]; then
      LD_PRELOAD=$PRELOAD "$@"
   else
      "$@"
   fi
}

# ---- 1. busted ----------------------------------------------------------------------------------
# one busted run; its output is shown and its counts added. A run that dies before its summary
# (a crash in C) still counts the progress marks it printed (plain output: + passed, - failed,
# * error) plus one failure for the crash.
run_busted() {
   # Debian's /usr/bin/busted is a Lua script: run it under LuaJIT directly. A luarocks-installed
   # busted is a shell wrapper: let it re-run itself under LuaJIT (--lua).
   local cmd
   if head -n 1 "$BUSTED" | grep -q 'lua'; then
      cmd=("$LUAJIT" "$BUSTED" --ignore-lua)
   else
      cmd=("$BUSTED" "--lua=$LUAJIT")
   fi
   # shellcheck disable=SC2086
   { run_preloaded "${cmd[@]}" ${BUSTED_OPTS:-} "$@" 2>&1; echo $? > "$log.rc"; } | tee "$log"
   local rc summary marks s f
   rc=$(cat "$log.rc" 2>/dev/null || echo 1)
   # strip colour codes, then take the last summary line
   summary=$(sed -e 's/\x1b\[[0-9;]*m//g' "$log" |
             grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' |
             tail -n 1)
   if [ -z "$summary" ]; then
      marks=$(grep -oE '^[-+*.]+' "$log" | tr -d '\n')
      s=$(printf '%s' "$marks" | tr -cd '+' | wc -c)
      f=$(printf '%s' "$marks" | tr -cd -- '-*' | wc -c)
      echo "run_tests: busted exited with status $rc before printing its summary" \
           "($s passed, $f failed before that)" >&2
      passed=$((passed + s))
      failed=$((failed + f + 1))
      return
   fi
   # fields: <s> successes / <f> failures / <e> errors / <p> pending : <t> seconds
   local e
   read -r s _ _ f _ _ e _ <<< "$summary"
   passed=$((passed + s))
   failed=$((failed + f + e))
   if [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ]; then
      echo "run_tests: busted exited with status $rc" >&2
      failed=$((failed + 1))
   fi
}

# LUMEN_TEST_EXCLUDE: whole spec files and C programs, and busted --filter-out patterns per file
declare -A excl_file=() excl_args=()
if [ -n "${LUMEN_TEST_EXCLUDE:-}" ]; then
   if [ ! -f "$LUMEN_TEST_EXCLUDE" ]; then
      echo "run_tests: LUMEN_TEST_EXCLUDE=$LUMEN_TEST_EXCLUDE is not a file" >&2
      failed=$((failed + 1))
   else
      while IFS= read -r line || [ -n "$line" ]; do
         line=${line%$'\r'}
         line=${line%%[[:space:]]#*}                  # a comment after the entry
         line=${line%"${line##*[![:space:]]}"}       # trailing blanks
         case $line in '' | '#'*) continue ;; esac
         if [[ $line == *': '* ]]; then
            f=${line%%: *}
            pat="^$(printf '%s' "${line#*: }" | sed 's/[][^$()%.*+?-]/%&/g')\$"
            excl_args[$f]+="--filter-out=$pat"$'\n'
         else
            excl_file[$line]=1
         fi
      done < "$LUMEN_TEST_EXCLUDE"
   fi
fi
if ! command -v "$LUAJIT" >/dev/null 2>&1; then
   echo "run_tests: $LUAJIT not found" >&2
   failed=$((failed + 1))
elif [ ! -f "$BUSTED" ]; then
   echo "run_tests: busted not found at $BUSTED (apt-get install lua-busted)" >&2
   failed=$((failed + 1))
elif [ $# -eq 0 ] && [ "${LUMEN_TEST_SPLIT:-1}" != 0 ]; then
   # one busted process per spec file (same .busted config): a crash in C loses only that file's
   # counts, and the file is named
   while IFS= read -r spec; do
      if is_device_skipped "$spec"; then
         echo "== $spec: skipped on $test_device (device_skip / cuda_skip in tools/run_tests.sh)"
         continue
      fi
      if [ -n "${excl_file[$spec]:-}" ]; then
         echo "== $spec: left out of this pass (LUMEN_TEST_EXCLUDE=$LUMEN_TEST_EXCLUDE)"
         continue
      fi
      args=()
      if [ -n "${excl_args[$spec]:-}" ]; then
         mapfile -t args < <(printf '%s' "${excl_args[$spec]}")
         echo "== $spec (${#args[@]} tests left out: LUMEN_TEST_EXCLUDE=$LUMEN_TEST_EXCLUDE)"
      else
         echo "== $spec"
      fi
      time_begin
      run_busted "${args[@]}" "$spec"
      time_end "$spec"
   done < <(if [ -n "${LUMEN_TEST_FILES:-}" ]; then
               # shellcheck disable=SC2086 # a list of paths, split on spaces
               printf '%s\n' $LUMEN_TEST_FILES
            else find spec -name '*_spec.lua' | sort; fi)
else
   run_busted "$@"
fi

# ---- 2. C test programs -------------------------------------------------------------------------
shopt -s nullglob
if [ -n "${LUMEN_TEST_CPROGS:-}" ]; then
   read -r -a cprogs <<< "$LUMEN_TEST_CPROGS"
else
   cprogs=(spec/c/*.c)
fi
if [ "${LUMEN_TEST_C:-1}" != 0 ] && [ ${#cprogs[@]} -gt 0 ]; then
   if [ ! -f "$build_abs/liblumen.so" ]; then
      echo "run_tests: $build_abs/liblumen.so is missing; the C tests need it" >&2
      failed=$((failed + ${#cprogs[@]}))
   else
      mkdir -p "$build_abs/spec_c"
      for src in "${cprogs[@]}"; do
         name=$(basename "$src" .c)
         if [ -n "${excl_file[$src]:-}" ]; then
            echo "== spec/c/$name: left out of this pass (LUMEN_TEST_EXCLUDE=$LUMEN_TEST_EXCLUDE)"
            continue
         fi
         exe=$build_abs/spec_c/$name
         echo "== spec/c/$name"
         time_begin
         # shellcheck disable=SC2086
         if ! "$CC" -std=c11 -Wall -Wextra -Werror -g -O1 -Isrc \
               $TEST_CFLAGS -o "$exe" "$src" -L"$build_abs" -llumen \
               -Wl,-rpath,"$build_abs" -lm -fopenmp; then
            echo "run_tests: spec/c/$name did not compile" >&2
            failed=$((failed + 1))
            time_end "spec/c/$name"
            continue
         fi
         { run_preloaded "$exe" 2>&1; echo $? > "$log.rc"; } | tee "$log"
         rc=$(cat "$log.rc" 2>/dev/null || echo 1)
         line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
         if [ -n "$line" ]; then
            read -r cp _ cf _ <<< "$line"
            passed=$((passed + cp))
            failed=$((failed + cf))
            if [ "$rc" -ne 0 ] && [ "$cf" -eq 0 ]; then
               echo "run_tests: spec/c/$name exited with status $rc" >&2
               failed=$((failed + 1))
            fi
         elif [ "$rc" -eq 0 ]; then
            passed=$((passed + 1))
         else
            echo "run_tests: spec/c/$name exited with status $rc" >&2
            failed=$((failed + 1))
         fi
         time_end "spec/c/$name"
      done
   fi
fi

if [ -n "${LUMEN_TEST_COUNTS:-}" ]; then
   echo "$passed $failed" > "$LUMEN_TEST_COUNTS"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
