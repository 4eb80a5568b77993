#!/usr/bin/env bash
# bench/amp.sh -- mixed precision beside PyTorch 2.x, in one run: the acceptance figures of
# docs/mixed_precision.md.
#   bash bench/amp.sh [threads] [iters]
# RUNS times (default 3), alternately:
# 1. lumen: bench/amp_ops.lua (bf16 operator rows) and bench/models.lua ... bf16 train (resnet50
#    batch 8 channels-last: inference float32 / folded / bf16 autocast / bf16 folded, training
#    step float32 / bf16 autocast)
# 2. the peer, a current PyTorch from ../shared/peer/setup_torch2.sh (PEER2_PY overrides its
#    python): bench/peer_amp.py (the same operator rows) and ../shared/peer/bench_models.py
#    resnet50 for eager / bf16 (torch.autocast("cpu", bfloat16)) / freeze (jit.freeze +
#    optimize_for_inference, the row beside lumen's folded one), inference and training
# then bench/compare (ratio = peer ms / lumen ms; > 1: lumen is faster) and lumen's own speed-up
# of bf16 over float32. Files in $BENCH_OUT (default /tmp/lumen-amp): lumen.txt, peer.txt.
set -u
cd "$(dirname "$0")/.." || exit 2
threads=${1:-2}
iters=${2:-12}
runs=${RUNS:-3}
out=${BENCH_OUT:-/tmp/lumen-amp}
peer_dir=${PEER_DIR:-../shared/peer}
mkdir -p "$out"
: > "$out/lumen.txt"
: > "$out/peer.txt"
status=0
py=${PEER2_PY:-}
if [ -z "$py" ] && [ -z "${NO_PEER:-}" ]; then
   py=$(bash "$peer_dir/setup_torch2.sh") || { echo "bench: no PyTorch 2.x peer" >&2; py=; }
fi
miters=$(( iters / 4 > 3 ? iters / 4 : 3 ))
# bench_models.py prints "img/s N": turn it into lumen's '<row> nhwc <ms>' for batch 8
peer_model() { # row mode variant
   local r
   if r=$("$py" "$peer_dir/bench_models.py" resnet50 8 224 "$2" nhwc "$miters" "$threads" "$3"); then
      echo "$r" | awk -v row="$1" '/^img\/s/ { printf "%s nhwc %.3f\n", row, 8000 / $2 }'
   else
      echo "bench: bench_models.py resnet50 $2 $3 failed" >&2
      return 1
   fi
}
for run in $(seq 1 "$runs"); do
   echo "== run $run/$runs: lumen bench/amp_ops.lua, bench/models.lua bf16 train (threads $threads)"
   OMP_NUM_THREADS=$threads bin/lumen bench/amp_ops.lua "$threads" "$iters" |
      tee -a "$out/lumen.txt" || status=1
   OMP_NUM_THREADS=$threads bin/lumen bench/models.lua "$threads" "$iters" bf16 train |
      tee -a "$out/lumen.txt" || status=1
   if [ -n "$py" ]; then
      echo "== run $run/$runs: peer $("$py" -c 'import torch; print("PyTorch", torch.__version__)')"
      OMP_NUM_THREADS=$threads "$py" bench/peer_amp.py "$threads" "$iters" |
         tee -a "$out/peer.txt" || status=1
      {
         peer_model resnet50_infer_b8 infer eager
         peer_model resnet50_infer_bf16_b8 infer bf16
         peer_model resnet50_infer_folded_b8 infer freeze
         peer_model resnet50_train_b8 train eager
         peer_model resnet50_train_bf16_b8 train bf16
      } | tee -a "$out/peer.txt" || status=1
   fi
done
echo "== comparison (ratio = peer ms / lumen ms; > 1 means lumen is faster)"
luajit bench/compare "$out/lumen.txt" "$out/peer.txt" || status=1
echo "== lumen bf16 speed-up over lumen float32 (medians)"
luajit - "$out/lumen.txt" <<'LUA' || status=1
local rows = {}
for line in io.lines(arg[1]) do
   local k, v = line:match("^(resnet50_%S+) nhwc ([%d.]+)$")
   if k then rows[k] = rows[k] or {}; table.insert(rows[k], tonumber(v)) end
end
local function med(k)
   local t = rows[k]
   if not t then return nil end
   table.sort(t)
   local n = #t
   return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2
end
for _, p in ipairs({ { "resnet50_infer_bf16_b8", "resnet50_infer_b8" },
                     { "resnet50_infer_bf16_folded_b8", "resnet50_infer_folded_b8" },
                     { "resnet50_train_bf16_b8", "resnet50_train_b8" } }) do
   local a, b = med(p[1]), med(p[2])
   if a and b then
      print(string.format("%-32s %8.1f ms (%5.1f img/s) vs float32 %8.1f ms (%5.1f img/s): %.2fx",
                          p[1], a, 8000 / a, b, 8000 / b, b / a))
   end
end
LUA
exit $status
