#!/usr/bin/env bash
# The multi-process tests of lm.distributed and DistributedDataParallel (spec/mpi/), one summary
# line "N passed, N failed" as tools/run_tests.sh prints it.
#
#   bash tools/mpi_tests.sh            (make test-mpi; the "mpi" stage of .ci/run)
#
#   1. spec/mpi/*_mpirun.lua: busted on every rank of `mpirun -np 2` (each rank's output to its own
#      files through --output-filename); both ranks' successes are counted, and a rank that dies
#      before its summary counts as one failure. Every run is under `timeout` (LUMEN_MPI_TIMEOUT,
#      default 300 s), so a collective that hangs fails the file instead of CI.
#   2. spec/mpi/*_launch.lua: plain busted; these start mpirun themselves (the failure cases:
#      a rank killed, a Lua error, an exit without finalize, mismatched shapes; restart_launch.lua:
#      bin/lumen-run's restarts, watchdog and exact resumption, ~40 s).
#   3. tools/netns_run.sh (~20 s): the same training on two "machines" (network namespaces, Open
#      MPI over TCP) with a rank killed, counted as one test; run when this host can make network
#      namespaces (root, iproute2) and has the Fashion-MNIST files, else skipped with a line that
#      says why (LUMEN_MPI_NETNS=0 skips it, =1 makes a missing prerequisite a failure).
# Needs Open MPI (mpirun, libmpi.so.40: apt-get install libopenmpi-dev openmpi-bin). Without it the
# stage fails with one failure and says so (CI installs it; `make test` does not need it).
# Environment: LUAJIT, BUSTED, LUMEN_MPIRUN (default "mpirun --allow-run-as-root --oversubscribe":
# CI runs as root on 2 cores), LUMEN_MPI_NP (2), LUMEN_TEST_COUNTS=FILE (also write "passed failed").
set -u
cd "$(dirname "$0")/.." || exit 2

LUAJIT=${LUAJIT:-luajit}
BUSTED=${BUSTED:-$(command -v busted || echo /usr/bin/busted)}
MPIRUN=${LUMEN_MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
NP=${LUMEN_MPI_NP:-2}
TIMEOUT=${LUMEN_MPI_TIMEOUT:-300}
export LUMEN_LIB=${LUMEN_LIB:-$(pwd)/build/liblumen.so}
export LUMEN_MPIRUN=$MPIRUN
# the in-tree Lua modules (busted's .busted config gives its own lpath too)
export LUA_PATH="$(pwd)/lua/?.lua;$(pwd)/lua/?/init.lua;./?.lua;${LUA_PATH:-;}"

passed=0
failed=0
finish() {
   if [ -n "${LUMEN_TEST_COUNTS:-}" ]; then echo "$passed $failed" > "$LUMEN_TEST_COUNTS"; fi
   echo "$passed passed, $failed failed"
   [ "$failed" -eq 0 ]
   exit $?
}

if ! command -v "${MPIRUN%% *}" >/dev/null 2>&1; then
   echo "mpi_tests: ${MPIRUN%% *} not found (apt-get install libopenmpi-dev openmpi-bin)" >&2
   failed=1
   finish
fi

busted_cmd=("$LUAJIT" "$BUSTED" --ignore-lua -o plainTerminal)

# add_summary FILE: the busted summary in FILE, or one failure when there is none
add_summary() {
   local summary s f e
   summary=$(sed -e 's/\x1b\[[0-9;]*m//g' "$1" 2>/dev/null |
             grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' |
             tail -n 1)
   if [ -z "$summary" ]; then
      echo "mpi_tests: no busted summary in $1" >&2
      failed=$((failed + 1))
      return
   fi
   read -r s _ _ f _ _ e _ <<< "$summary"
   passed=$((passed + s))
   failed=$((failed + f + e))
}

work=$(mktemp -d /tmp/lumen-mpi.XXXXXX)
trap 'rm -rf "$work"' EXIT

shopt -s nullglob
for spec in spec/mpi/*_mpirun.lua; do
   name=$(basename "$spec" .lua)
   echo "== $spec (mpirun -np $NP)"
   out=$work/$name
   # shellcheck disable=SC2086
   timeout "$TIMEOUT" $MPIRUN -np "$NP" --output-filename "$out" "${busted_cmd[@]}" "$spec" \
      > "$work/$name.log" 2>&1
   rc=$?
   for ((r = 0; r < NP; r++)); do
      f=$(ls -d "$out"/*/rank.$r 2>/dev/null | head -n 1)
      echo "-- rank $r"
      if [ -n "$f" ]; then cat "$f/stdout"; add_summary "$f/stdout"; else
         echo "mpi_tests: rank $r wrote nothing" >&2; failed=$((failed + 1)); fi
   done
   if [ "$rc" -ne 0 ]; then
      echo "mpi_tests: mpirun exited with status $rc$([ "$rc" -eq 124 ] && echo " (timeout ${TIMEOUT}s)")" >&2
      tail -n 30 "$work/$name.log" >&2
      [ "$failed" -eq 0 ] && failed=1
   fi
done

for spec in spec/mpi/*_launch.lua; do
   echo "== $spec"
   timeout "$TIMEOUT" "${busted_cmd[@]}" "$spec" > "$work/launch.log" 2>&1
   cat "$work/launch.log"
   add_summary "$work/launch.log"
done

# the two-"machines" run: only where network namespaces can be made
netns=${LUMEN_MPI_NETNS:-auto}
if [ "$netns" != 0 ]; then
   why=
   probe=lumen-probe-$$
   if [ "$(id -u)" -ne 0 ]; then why="not root"
   elif ! command -v ip >/dev/null 2>&1; then why="no ip (iproute2)"
   elif ! ip netns add "$probe" >/dev/null 2>&1; then why="ip netns add is not allowed here"
   else
      ip netns del "$probe" >/dev/null 2>&1
      [ -d "${LUMEN_NETNS_DATA:-/usr/share/datasets/fashion-mnist}" ] || why="no Fashion-MNIST files"
   fi
   echo "== tools/netns_run.sh"
   if [ -n "$why" ]; then
      echo "netns_run: skipped ($why)"
      [ "$netns" = 1 ] && failed=$((failed + 1))
   elif timeout "$TIMEOUT" bash tools/netns_run.sh > "$work/netns.log" 2>&1; then
      grep -E "^(== |lumen-run: |reference step|netns_run: )" "$work/netns.log"
      passed=$((passed + 1))
   else
      cat "$work/netns.log"
      echo "mpi_tests: tools/netns_run.sh failed" >&2
      failed=$((failed + 1))
   fi
fi

finish
