#!/usr/bin/env bash
# Run lumen's libFuzzer harnesses (built by `make fuzz-build` into $FUZZ_BUILD) and print one
# line per harness, then "N passed, N failed" (a harness passes when its known findings no
# longer reproduce and the fuzzer ran its budget without a new one).
#
#   bash fuzz/run.sh [harness...]      (default: every harness; `make fuzz` / `make fuzz-ci`)
#
# For each harness H:
#   1. replay: every reproducer saved as fuzz/found/H-* must now run cleanly (a regression check
#      for fixed findings; a finding that is not fixed yet fails here, as it should)
#   2. fuzz for FUZZ_SECONDS: the working corpus is $FUZZ_BUILD/corpus/H (kept between runs, so
#      a long run by hand builds on the previous one), seeded from fuzz/corpus/H (read only);
#      fuzz/dict/H.dict is used when present. A crash, sanitizer report, leak, timeout (over
#      FUZZ_TIMEOUT s for one input) or out-of-memory (over FUZZ_RSS_MB) stops the run and
#      writes the input to $FUZZ_BUILD/artifacts/H/ (crash-*, leak-*, timeout-*, oom-*).
# Environment: FUZZ_BUILD (build-fuzz), FUZZ_SECONDS (3600), FUZZ_JOBS (1; more runs that many
# processes with libFuzzer's -fork), FUZZ_TIMEOUT (10), FUZZ_RSS_MB (2048), FUZZ_ARGS (more
# libFuzzer options), LUMEN_FUZZ_COUNTS=FILE (also write "passed failed" to FILE).
set -u
cd "$(dirname "$0")/.." || exit 2

FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-3600}
FUZZ_JOBS=${FUZZ_JOBS:-1}
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-10}
FUZZ_RSS_MB=${FUZZ_RSS_MB:-2048}
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then harnesses=(idx idx_gz image safetensors checkpoint jit); fi

# the sanitizers: stop at the first report, with symbolised stacks
# (leaks: LeakSanitizer is on by default; the Lua harnesses turn it off and check lumen's own
# byte counter instead, see fuzz/lua_fuzz.c)
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

passed=0
failed=0
summary=()
for h in "${harnesses[@]}"; do
   bin=$FUZZ_BUILD/fuzz_$h
   echo "== fuzz $h (${FUZZ_SECONDS}s)"
   if [ ! -x "$bin" ]; then
      echo "fuzz: $bin is missing (make fuzz-build)" >&2
      failed=$((failed + 1))
      summary+=("$h: not built")
      continue
   fi
   ok=1
   why=
   shopt -s nullglob
   found=(fuzz/found/"$h"-*)
   shopt -u nullglob
   if [ ${#found[@]} -gt 0 ]; then
      echo "-- replaying ${#found[@]} saved finding(s): ${found[*]}"
      for f in "${found[@]}"; do
         if ! "$bin" -timeout="$FUZZ_TIMEOUT" -rss_limit_mb="$FUZZ_RSS_MB" "$f" > \
               "$FUZZ_BUILD/replay-$h.log" 2>&1; then
            grep -E "ERROR|SUMMARY|check failed|runtime error" "$FUZZ_BUILD/replay-$h.log" | head -n 3
            echo "fuzz: $h: saved finding $f still reproduces (log: $FUZZ_BUILD/replay-$h.log)"
            ok=0
            why="$why ${f##*/}"
         fi
      done
   fi
   corpus=$FUZZ_BUILD/corpus/$h
   artifacts=$FUZZ_BUILD/artifacts/$h
   mkdir -p "$corpus" "$artifacts"
   args=(-max_total_time="$FUZZ_SECONDS" -timeout="$FUZZ_TIMEOUT" -rss_limit_mb="$FUZZ_RSS_MB"
         -artifact_prefix="$artifacts/" -print_final_stats=1)
   if [ -f "fuzz/dict/$h.dict" ]; then args+=(-dict="fuzz/dict/$h.dict"); fi
   if [ "$FUZZ_JOBS" -gt 1 ]; then args+=(-fork="$FUZZ_JOBS"); fi
   # libFuzzer's fork mode (-fork) can overrun -max_total_time by a whole job: a stop (SIGINT,
   # after which it prints its statistics) a little after the budget bounds the run; timeout
   # then exits with 124, which counts as a run that ended without a finding
   limit=$((FUZZ_SECONDS + FUZZ_SECONDS / 10 + 30))
   # shellcheck disable=SC2086
   timeout -s INT -k 30 "$limit" "$bin" "${args[@]}" ${FUZZ_ARGS:-} "$corpus" "fuzz/corpus/$h" \
      > "$FUZZ_BUILD/fuzz-$h.log" 2>&1
   rc=$?
   if [ "$rc" -eq 124 ]; then
      echo "-- stopped after ${limit}s (the budget plus a margin)"
      rc=0
   fi
   if [ "$rc" -eq 0 ]
   then
      grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+ *DONE" \
         "$FUZZ_BUILD/fuzz-$h.log" | tail -n 3
   else
      grep -E "ERROR|SUMMARY|check failed|runtime error|Test unit written" \
         "$FUZZ_BUILD/fuzz-$h.log" | head -n 6
      echo "fuzz: $h: the fuzzer found a problem (log: $FUZZ_BUILD/fuzz-$h.log; reproduce: $bin <file>)"
      ok=0
      why="$why new finding"
   fi
   if [ "$ok" = 1 ]; then
      passed=$((passed + 1))
      summary+=("$h: ok")
   else
      failed=$((failed + 1))
      summary+=("$h: FAILED ($why )")
   fi
done

echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
if [ -n "${LUMEN_FUZZ_COUNTS:-}" ]; then echo "$passed $failed" > "$LUMEN_FUZZ_COUNTS"; fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
