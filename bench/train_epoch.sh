#!/usr/bin/env bash
# bench/train_epoch.sh -- examples/train.lua (the README's main job: small_resnet on
# Fashion-MNIST, batch 128, SGD nesterov, warm-up + cosine) beside its PyTorch 2.x twin
# bench/peer_train.py (same model, batch, optimizer, schedule and data files), per epoch, in one run.
#   bash bench/train_epoch.sh [threads] [epochs] [limit]
# threads 2, epochs 1, limit 0 (the whole training set: 468 steps an epoch; --limit N trains on
# the first N images and tests on the first N, both sides). RUNS times (default 3), alternately:
# lumen (train.lua --log: the epoch records' epoch_time, the training loop without the test
# pass and the checkpoint), then the twin (its epoch_time: the same loop, batch preparation
# included). Prints every epoch's time, test accuracy and mean training loss, then per epoch the
# medians over the runs and the ratio PyTorch s / lumen s (> 1: lumen is faster).
# AMP=bf16: both sides in bfloat16 autocast (train.lua --amp bf16; the twin's --amp bf16,
# torch.autocast("cpu", dtype=torch.bfloat16): oneDNN, on AMX tiles where the CPU has them).
# OpenMP: bin/lumen sets GOMP_SPINCOUNT=1000 when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set
# (lua/lumen/C.lua: on a shared machine libgomp's default spinning makes a step many times
# slower); the twin gets the same setting (PyTorch's wheels use libgomp too) unless
# PEER_OMP_DEFAULT=1. PEER2_PY is the twin's python (default: ../shared/peer/setup_torch2.sh's,
# or ~/.cache/lumen-peer-torch2/bin/python). Files in $BENCH_OUT (default /tmp/lumen-train-epoch).
set -u
cd "$(dirname "$0")/.." || exit 2
threads=${1:-2}
epochs=${2:-1}
limit=${3:-0}
runs=${RUNS:-3}
out=${BENCH_OUT:-/tmp/lumen-train-epoch}
peer_dir=${PEER_DIR:-../shared/peer}
mkdir -p "$out"
py=${PEER2_PY:-}
if [ -z "$py" ]; then
   if [ -f "$peer_dir/setup_torch2.sh" ]; then
      py=$(bash "$peer_dir/setup_torch2.sh") || py=
   elif [ -x "$HOME/.cache/lumen-peer-torch2/bin/python" ]; then
      py=$HOME/.cache/lumen-peer-torch2/bin/python
   fi
fi
[ -n "$py" ] || { echo "bench: no PyTorch 2.x twin (set PEER2_PY)" >&2; exit 1; }
peer_env=()
if [ -z "${PEER_OMP_DEFAULT:-}" ] && [ -z "${GOMP_SPINCOUNT:-}" ] && [ -z "${OMP_WAIT_POLICY:-}" ]; then
   peer_env=(GOMP_SPINCOUNT=1000)
fi
echo "== threads $threads, epochs $epochs, limit $limit, $runs runs, amp ${AMP:-none}; twin OpenMP:" \
     "${peer_env[*]:-the PyTorch default}"
status=0
: > "$out/lumen.txt"
: > "$out/peer.txt"
for run in $(seq 1 "$runs"); do
   echo "== run $run/$runs: lumen examples/train.lua (load $(cut -d' ' -f1-3 /proc/loadavg))"
   rm -f "$out/lumen.jsonl"
   if OMP_NUM_THREADS=$threads bin/lumen examples/train.lua --epochs "$epochs" --limit "$limit" \
         --threads "$threads" --quiet --log "$out/lumen.jsonl" --checkpoint "$out/train.ckpt" \
         ${AMP:+--amp "$AMP"} \
         > "$out/lumen_run.log" 2>&1; then
      # the epoch records, as '<epoch> <epoch_time> <test_accuracy> <train_loss>'
      luajit - "$out/lumen.jsonl" <<'LUA' | tee -a "$out/lumen.txt" | sed 's/^/   lumen epoch /'
for l in io.lines(arg[1]) do
   if l:find('"event":"epoch"', 1, true) then
      local function f(k) return l:match('"' .. k .. '":([-%d.eE+]+)') end
      print(string.format("%s %s %s %s", f("epoch"), f("epoch_time"), f("test_accuracy"),
                          f("train_loss")))
   end
end
LUA
   else
      echo "bench: examples/train.lua failed (see $out/lumen_run.log)" >&2
      status=1
   fi
   echo "== run $run/$runs: PyTorch twin bench/peer_train.py (load $(cut -d' ' -f1-3 /proc/loadavg))"
   if env OMP_NUM_THREADS="$threads" "${peer_env[@]}" "$py" bench/peer_train.py --epochs "$epochs" \
         --limit "$limit" --threads "$threads" --quiet ${AMP:+--amp "$AMP"} \
         > "$out/peer_run.log" 2>/dev/null; then
      awk '/^epoch / { print $2, $4, $10, $8 }' "$out/peer_run.log" | tee -a "$out/peer.txt" |
         sed 's/^/   PyTorch epoch /'
   else
      echo "bench: bench/peer_train.py failed (see $out/peer_run.log)" >&2
      status=1
   fi
done
echo "== per epoch, medians of $runs runs (seconds; ratio = PyTorch / lumen, > 1: lumen is faster)"
luajit - "$out/lumen.txt" "$out/peer.txt" <<'LUA' || status=1
local function read(path)
   local t = {}
   for l in io.lines(path) do
      local e, s, acc, loss = l:match("^(%d+) ([-%d.eE+]+) ([-%d.eE+]+) ([-%d.eE+]+)")
      if e then
         e = tonumber(e)
         t[e] = t[e] or { s = {}, acc = {}, loss = {} }
         table.insert(t[e].s, tonumber(s))
         table.insert(t[e].acc, tonumber(acc))
         table.insert(t[e].loss, tonumber(loss))
      end
   end
   return t
end
local function med(v)
   if not v or #v == 0 then return nil end
   local c = {}
   for i = 1, #v do c[i] = v[i] end
   table.sort(c)
   local n = #c
   return n % 2 == 1 and c[(n + 1) / 2] or (c[n / 2] + c[n / 2 + 1]) / 2
end
local L, P = read(arg[1]), read(arg[2])
print(string.format("  %-6s %9s %9s %7s   %-19s %-19s", "epoch", "lumen s", "PyTorch s", "ratio",
                    "test acc lumen/PT", "train loss lumen/PT"))
for e = 1, 1000 do
   local l, p = L[e], P[e]
   if not l and not p then break end
   local ls, ps = l and med(l.s), p and med(p.s)
   print(string.format("  %-6d %9.2f %9.2f %7s   %6.2f%% / %6.2f%%   %.4f / %.4f", e, ls or 0,
      ps or 0, (ls and ps) and string.format("%.2fx", ps / ls) or "-",
      100 * (l and med(l.acc) or 0), 100 * (p and med(p.acc) or 0),
      l and med(l.loss) or 0, p and med(p.loss) or 0))
end
LUA
exit $status
