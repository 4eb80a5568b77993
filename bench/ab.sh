#!/usr/bin/env bash
# bench/ab.sh OLD_TREE [threads] [iters] -- this tree's benchmarks beside another lumen tree's
# (an older commit, built there with `make`), alternating RUNS times (default 5), with medians:
# the "no speed lost" check of a refactoring. Ratio = old ms / new ms (> 1: this tree is
# faster; within noise is about 0.97..1.03 on the shared 2-core machine).
#   git worktree add /tmp/old <commit> && make -C /tmp/old && BENCH_MODELS=1 bash bench/ab.sh /tmp/old
# Each side runs its own bench/*.lua with its own lua/ and build/ (bin/lumen of that tree).
# Output: $BENCH_OUT (default /tmp/lumen-ab)/{new,old}.txt and the comparison.
set -u
cd "$(dirname "$0")/.." || exit 2
old=${1:?usage: bench/ab.sh OLD_TREE [threads] [iters]}
threads=${2:-2}
iters=${3:-20}
runs=${RUNS:-5}
out=${BENCH_OUT:-/tmp/lumen-ab}
mkdir -p "$out"
: > "$out/new.txt"
: > "$out/old.txt"
status=0
for run in $(seq 1 "$runs"); do
   for side in old new; do
      tree=.
      [ "$side" = old ] && tree=$old
      echo "== run $run/$runs: $side ($tree)"
      (cd "$tree" && NO_PEER=1 RUNS=1 BENCH_OUT="$out/$side-run" bash bench/run.sh "$threads" \
         "$iters" > "$out/$side-run.log" 2>&1) || { echo "bench: $side run failed ($out/$side-run.log)"; status=1; }
      grep -E '^[A-Za-z0-9_]+ [a-z_]+ [0-9.]+$' "$out/$side-run/lumen.txt" >> "$out/$side.txt"
   done
done
echo "== comparison (the 'peer' column is the old tree; ratio = old ms / new ms)"
luajit bench/compare "$out/new.txt" "$out/old.txt" || status=1
exit $status
