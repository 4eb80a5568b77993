#!/usr/bin/env bash
# tools/gpu_suite.sh -- the busted suite on a device, spec files run in parallel (the GPU machine
# has 16 cores; tools/run_tests.sh runs them one after another). Each spec file is one
# `bash tools/run_tests.sh FILE` (one busted process, LUMEN_TEST_COUNTS for its counts) under a
# timeout, so a crash or a hang costs that file alone; the files tools/run_tests.sh skips on a
# device (its device_skip list, read from it) are skipped here too.
#
#   tools/gpu_suite.sh LOGDIR [FILE...]      (default: every spec/**/*_spec.lua)
#
# Environment: LUMEN_TEST_DEVICE (required, e.g. cuda:0), SUITE_JOBS (parallel files, default 8),
# SUITE_FILE_TIMEOUT (seconds per file, default 120), SUITE_DEADLINE (a `date +%s` time: files
# start with a timeout that ends by then; files not started by then are listed "not run"), and
# everything tools/run_tests.sh reads (LUAJIT, BUSTED, LUMEN_LIB, ...). Writes LOGDIR/<file>.log per spec file, LOGDIR/failures.txt
# (one line per failing test: "file @ line | test name | message") and prints:
#   one line per file "<passed> <failed> <seconds>s <file> [timed out|crashed|not run]"
#   "FAILURES" and the busted failure/error blocks (file, test name, message: 8 lines each)
#   the last line: "N passed, N failed" (a file that timed out or died before its counts counts
#   one failure). Exit status 0 only when nothing failed.
set -u
cd "$(dirname "$0")/.." || exit 2
logdir=${1:?usage: tools/gpu_suite.sh LOGDIR [FILE...]}
shift
mkdir -p "$logdir" || exit 2
: "${LUMEN_TEST_DEVICE:?set LUMEN_TEST_DEVICE (e.g. cuda:0)}"
jobs=${SUITE_JOBS:-8}
per_file=${SUITE_FILE_TIMEOUT:-120}
export LUMEN_TEST_C=0

# the device_skip and cuda_skip lists of tools/run_tests.sh (one source of truth)
skip=$(sed -n -e '/^device_skip=(/,/^)/p' -e '/^cuda_skip=(/,/^)/p' tools/run_tests.sh |
   grep -oE 'spec/[A-Za-z0-9_/.-]+\.lua')

if [ $# -gt 0 ]; then
   files=$(printf '%s\n' "$@")
else
   files=$(find spec -name '*_spec.lua' | sort)
fi
list=()
for f in $files; do
   if printf '%s\n' "$skip" | grep -qxF "$f"; then
      echo "skip $f (device_skip / cuda_skip in tools/run_tests.sh)"
      continue
   fi
   list+=("$f")
done

one() {
   local f=$1 name t0 rc note='' t
   name=$(printf '%s' "$f" | tr '/' '_')
   t0=$(date +%s)
   t=$per_file
   if [ -n "$deadline" ] && [ $((deadline - t0)) -lt "$t" ]; then t=$((deadline - t0)); fi
   if [ "$t" -lt 5 ]; then
      echo "0 0 0s $f not run (out of time)"
      return
   fi
   echo "== $f" > "$logdir/$name.log"
   timeout -k 5 "$t" env LUMEN_TEST_COUNTS="$logdir/$name.counts" \
      bash tools/run_tests.sh "$f" >> "$logdir/$name.log" 2>&1
   rc=$?
   [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note=" timed out after ${t}s"
   if [ -s "$logdir/$name.counts" ]; then
      read -r p q < "$logdir/$name.counts"
   else
      p=0 q=1
      [ -z "$note" ] && note=" crashed (status $rc, no counts)"
   fi
   echo "$p $q $(( $(date +%s) - t0 ))s $f$note"
}
export -f one
deadline=${SUITE_DEADLINE:-}
export logdir per_file deadline

# slow files first would pack better; the order is the sorted one, which is good enough
printf '%s\n' "${list[@]}" | xargs -P "$jobs" -I{} bash -c 'one "$1"' _ {} | tee "$logdir/files.txt"

passed=$(awk '{p += $1} END {print p + 0}' "$logdir/files.txt")
failed=$(awk '{f += $2} END {print f + 0}' "$logdir/files.txt")

echo "FAILURES"
# busted's plain/utf output: a block per failure or error, starting "Failure -> file @ line" or
# "Error -> ..." ("→" on a terminal); keep its first 8 lines (location, test name, message)
for log in "$logdir"/*.log; do
   sed -e 's/\x1b\[[0-9;]*m//g' "$log" |
      awk '/^(Failure|Error) (→|->) / {if (n > 0) print "--"; n = 8}
           /^[0-9]+ passed, [0-9]+ failed$|^run_tests: / {if (n > 0) print "--"; n = 0}
           n > 0 {print; n--; if (n == 0) print "--"}
           # busted itself died (a crash in C: no failure block for the test that was running)
           NR == 1 && /^== / {file = $2}
           /^run_tests: busted exited|Segmentation fault|Aborted|core dumped/ {print "CRASH " file ": " $0}'
done
awk '/timed out|crashed|not run/ {print "FILE " $4 ":" substr($0, index($0, $4) + length($4))}' \
   "$logdir/files.txt"
# one line per failure for summaries: "<file @ line> | <test name> | <first message line>"
for log in "$logdir"/*.log; do
   sed -e 's/\x1b\[[0-9;]*m//g' "$log" |
      awk '/^(Failure|Error) (→|->) / {loc = $3 " @ " $5; n = 1; next}
           n == 1 {name = $0; n = 2; next}
           n == 2 {print substr(loc " | " name " | " $0, 1, 200); n = 0}
           NR == 1 && /^== / {file = $2}
           /^run_tests: busted exited/ {print file " | (busted died: a crash; the test running then is the next after the passed ones) | " $0}'
done > "$logdir/failures.txt"
awk '/timed out|crashed/ {print $4 " | (whole file) |" substr($0, index($0, $4) + length($4))}' \
   "$logdir/files.txt" >> "$logdir/failures.txt"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
