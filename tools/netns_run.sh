#!/usr/bin/env bash
# tools/netns_run.sh -- examples/train.lua --distributed on two "machines" on this host, under
# bin/lumen-run, with a rank on the second machine killed part-way: two network namespaces
# joined by a veth pair (10.77.0.1 and 10.77.0.2), Open MPI over TCP between them (a hostfile of
# the two addresses; mpirun's rsh launcher starts the remote daemon through `ip netns exec`
# instead of ssh), the same training as on one machine, and the same final parameters.
#
#   bash tools/netns_run.sh [--fault kill|stop|none] [--epochs N] [--limit N]
#
# Needs root (ip netns), iproute2, Open MPI and the Fashion-MNIST files
# (/usr/share/datasets/fashion-mnist, or LUMEN_NETNS_DATA=DIR). Steps:
#   1. the reference: lumen-run -np 2 on this machine, no faults
#   2. the same command inside namespace A with --hostfile (rank 0 on 10.77.0.1 = A, rank 1 on
#      10.77.0.2 = B), --mca btl tcp,self (no shared memory between the "machines"), the
#      interfaces restricted to the veth pair; after 20 heartbeats of rank 1 (in B) the fault
#      (default SIGKILL) hits it, the launcher restarts the job and it resumes from its checkpoint
#   3. the final parameters of both, compared (max relative difference; bit-identical expected)
# Prints each step's command and output; exits 0 when the two-machine run ended with status 0
# and the parameters agree within 1e-5. The namespaces and files are removed at the end.
#
# What this does not show: the namespaces share this host's file system and process table, so
# the checkpoint and the heartbeat folder are "shared storage", and the launcher's clean-up
# reaches the remote ranks directly; across real machines the clean-up of remote ranks is
# mpirun's (docs/distributed.md, "Surviving failures").
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

fault="kill"
epochs=2
limit=1024
while [ $# -gt 0 ]; do
   case "$1" in
      --fault) fault=$2; shift 2 ;;
      --epochs) epochs=$2; shift 2 ;;
      --limit) limit=$2; shift 2 ;;
      -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) echo "netns_run: unknown argument $1" >&2; exit 2 ;;
   esac
done
case "$fault" in kill|stop|none) ;; *) echo "netns_run: --fault is kill, stop or none" >&2; exit 2 ;; esac

if [ "$(id -u)" -ne 0 ]; then echo "netns_run: needs root (ip netns)" >&2; exit 2; fi
command -v ip >/dev/null || { echo "netns_run: needs iproute2 (ip)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "netns_run: needs Open MPI (mpirun)" >&2; exit 2; }
DATA=${LUMEN_NETNS_DATA:-/usr/share/datasets/fashion-mnist}
[ -d "$DATA" ] || { echo "netns_run: no data at $DATA (set LUMEN_NETNS_DATA)" >&2; exit 2; }

# names unique to this run (several may share the host)
A=lumen-a-$$
B=lumen-b-$$
VA=lmva$$
VB=lmvb$$
IP_A=10.77.0.1
IP_B=10.77.0.2
work=$(mktemp -d /tmp/lumen-netns.XXXXXX)
cleanup() {
   ip netns del "$A" 2>/dev/null
   ip netns del "$B" 2>/dev/null
   rm -rf "$work"
}
trap cleanup EXIT

say() { echo "== $*"; }
run() { echo "\$ $*"; "$@"; }

say "two machines: namespaces $A ($IP_A) and $B ($IP_B), joined by veth $VA-$VB"
run ip netns add "$A" || exit 1
run ip netns add "$B" || exit 1
run ip link add "$VA" type veth peer name "$VB" || exit 1
run ip link set "$VA" netns "$A"
run ip link set "$VB" netns "$B"
run ip -n "$A" addr add "$IP_A/24" dev "$VA"
run ip -n "$B" addr add "$IP_B/24" dev "$VB"
for ns in "$A" "$B"; do
   ip -n "$ns" link set lo up
done
run ip -n "$A" link set "$VA" up
run ip -n "$B" link set "$VB" up
ip -n "$A" -br addr show "$VA"
ip -n "$B" -br addr show "$VB"

# the launcher mpirun uses instead of ssh: `AGENT HOST COMMAND...` runs COMMAND (a shell
# command line, as ssh runs it) in HOST's namespace
cat > "$work/agent" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
   $IP_A) ns=$A ;;
   $IP_B) ns=$B ;;
   *) echo "netns agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$work/agent"
printf '%s slots=1\n%s slots=1\n' "$IP_A" "$IP_B" > "$work/hosts"
say "hostfile"
cat "$work/hosts"

TRAIN=(examples/train.lua --distributed --threads 1 --workers 1 --data "$DATA" --limit "$limit"
       --batch-size 32 --width 8 --epochs "$epochs" --eval-batch 500 --save-every 8 --quiet)
# as root, without asking for --allow-run-as-root on every daemon
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

say "1. the reference: one machine, no faults"
t0=$(date +%s%N)
run timeout 300 bin/lumen-run -np 2 -- "${TRAIN[@]}" --checkpoint "$work/ref.ckpt" || exit 1
echo "(reference: $(( ($(date +%s%N) - t0) / 1000000 )) ms)"

say "2. two machines over TCP, fault: $fault on rank 1 (in $B)"
hb=$work/hb
MPIARGS=(--mca plm_rsh_agent "$work/agent" --mca btl "tcp,self"
         --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
LARGS=()
for a in "${MPIARGS[@]}"; do LARGS+=(--mpirun-arg "$a"); done
t0=$(date +%s%N)
echo "\$ ip netns exec $A bin/lumen-run -np 2 --hostfile $work/hosts --max-restarts 2" \
     "--watchdog 20 --heartbeat-dir $hb ${LARGS[*]} -- ${TRAIN[*]} --checkpoint $work/two.ckpt"
ip netns exec "$A" timeout 300 "$ROOT/bin/lumen-run" -np 2 --hostfile "$work/hosts" \
   --max-restarts 2 --watchdog 20 --heartbeat-dir "$hb" "${LARGS[@]}" -- \
   "${TRAIN[@]}" --checkpoint "$work/two.ckpt" &
job=$!
if [ "$fault" != none ]; then
   # rank 1's heartbeat file in the first start: "beat N pid P host H"
   pid=
   for _ in $(seq 1 600); do
      if [ -f "$hb/start.0/rank.1" ]; then
         read -r word n _ p _ < "$hb/start.0/rank.1" || true
         if [ "${word:-}" = beat ] && [ "${n:-0}" -ge 20 ]; then pid=$p; break; fi
      fi
      kill -0 "$job" 2>/dev/null || break
      sleep 0.1
   done
   if [ -n "$pid" ]; then
      netns_of() { ip netns identify "$1" 2>/dev/null; }
      echo "== rank 1 is pid $pid in namespace $(netns_of "$pid") (rank 0's namespace: $A);" \
           "sending SIG$(echo "$fault" | tr '[:lower:]' '[:upper:]')"
      if [ "$fault" = kill ]; then kill -KILL "$pid"; else kill -STOP "$pid"; fi
   else
      echo "netns_run: rank 1 never reached 20 heartbeats" >&2
   fi
fi
wait "$job"
rc=$?
echo "(two machines: exit status $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms)"

say "3. the final parameters"
bin/lumen -e "
local rc = $rc
local a = lm.load_checkpoint('$work/ref.ckpt')
local b = lm.load_checkpoint('$work/two.ckpt')
local worst, same, n = 0, true, 0
for k, t in pairs(a.model) do
   local u = b.model[k]
   if t:is_floating_point() then
      local d = (t:to(lm.float64) - u:to(lm.float64)):abs():max():item()
      if d ~= 0 then same = false end
      worst = math.max(worst, d / math.max(t:to(lm.float64):abs():max():item(), 1e-30))
      n = n + 1
   end
end
print(('reference step %d, two machines step %d; %d tensors, max relative difference %.3g (%s)')
      :format(a.fields.step, b.fields.step, n, worst, same and 'bit-identical' or 'not identical'))
os.exit((rc == 0 and worst <= 1e-5 and a.fields.step == b.fields.step) and 0 or 1)
" || { echo "netns_run: FAILED" >&2; exit 1; }
[ "$rc" -eq 0 ] || { echo "netns_run: FAILED (status $rc)" >&2; exit 1; }
echo "netns_run: OK"
