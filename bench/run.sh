#!/usr/bin/env bash
# lumen's benchmark harness.
#   bash bench/run.sh [threads] [iters]        (make bench)
# RUNS times (default 5), alternately:
# 1. every bench/*.lua through bin/lumen, with arg[1] = threads, arg[2] = iters; each prints rows
#    "<op> <fmt> <ms>" (median milliseconds), the same rows the peer prints
# 2. the peer, ../shared/peer/bench_ops.py (PEER_DIR overrides), when /usr/bin/python3 has torch,
#    and bench/peer_extra.py (lumen's own peer script for rows bench_ops.py lacks)
# then bench/compare: each row's median over the runs, side by side, with the ratio peer/lumen
# (> 1: lumen is faster). The machine is shared and noisy: alternating the two and taking
# medians is what makes the ratio meaningful.
# Output files go to $BENCH_OUT (default /tmp/lumen-bench): lumen.txt, peer.txt.
# Set BENCH_ONLY=name to run bench/name.lua alone, NO_PEER=1 to skip the peer. BENCH_MODELS=1
# adds bench/models.lua (resnet50 inference, about 20 s a run) and the peer's bench_models.py
# (its img/s turned into the same '<row> nhwc <ms>' line); without it bench/models.lua is skipped.
# Mixed precision (bf16 rows beside PyTorch 2.x) has its own driver: bench/amp.sh; the 3-D (video)
# rows and r3d_18 beside PyTorch 2.x theirs: bench/video.sh.
set -u
cd "$(dirname "$0")/.." || exit 2
threads=${1:-2}
iters=${2:-20}
out=${BENCH_OUT:-/tmp/lumen-bench}
peer_dir=${PEER_DIR:-../shared/peer}
mkdir -p "$out"
: > "$out/lumen.txt"
: > "$out/peer.txt"
status=0
runs=${RUNS:-5}

shopt -s nullglob
scripts=(bench/*.lua)
if [ -n "${BENCH_ONLY:-}" ]; then
   scripts=("bench/${BENCH_ONLY%.lua}.lua")
else
   # bench/amp_ops.lua and the video scripts have their own peer (PyTorch 2.x): bench/amp.sh
   # and bench/video.sh run them; bench/jit_freeze.lua compares two lumen paths (no peer) and
   # runs on its own (docs/shipping_models.md); bench/ddp.lua runs under mpirun
   # (docs/distributed.md); bench/train_profile.lua has its own driver beside PyTorch 2.x,
   # bench/train_profile.sh (about a minute a run)
   kept=()
   for f in "${scripts[@]}"; do
      case "$f" in
         bench/amp_ops.lua | bench/video_ops.lua | bench/video_models.lua | bench/jit_freeze.lua) ;;
         bench/ddp.lua | bench/train_profile.lua) ;;
         bench/models.lua) [ -n "${BENCH_MODELS:-}" ] && kept+=("$f") ;;
         *) kept+=("$f") ;;
      esac
   done
   scripts=("${kept[@]}")
fi
models=
case " ${scripts[*]} " in *" bench/models.lua "*) models=1 ;; esac
if [ ${#scripts[@]} -eq 0 ]; then
   echo "bench: no bench/*.lua scripts yet"
fi
have_peer=
if [ -z "${NO_PEER:-}" ] && [ -x /usr/bin/python3 ] && [ -f "$peer_dir/bench_ops.py" ] &&
      /usr/bin/python3 -c 'import torch' 2>/dev/null; then
   have_peer=1
else
   echo "== peer skipped (needs /usr/bin/python3 with torch and $peer_dir/bench_ops.py)"
fi
for run in $(seq 1 "$runs"); do
   for f in "${scripts[@]}"; do
      echo "== run $run/$runs: lumen $f (threads $threads, iters $iters)"
      if ! OMP_NUM_THREADS=$threads bin/lumen "$f" "$threads" "$iters" | tee -a "$out/lumen.txt"; then
         echo "bench: $f failed" >&2
         status=1
      fi
   done
   if [ -n "$have_peer" ]; then
      echo "== run $run/$runs: peer $peer_dir/bench_ops.py (PyTorch, threads $threads, iters $iters)"
      /usr/bin/python3 "$peer_dir/bench_ops.py" "$threads" "$iters" | tee -a "$out/peer.txt" || status=1
      if [ -z "${BENCH_ONLY:-}" ] || [ "${BENCH_ONLY%.lua}" = ops ]; then
         /usr/bin/python3 bench/peer_extra.py "$threads" "$iters" | tee -a "$out/peer.txt" || status=1
      fi
      if [ -n "$models" ] && [ -f "$peer_dir/bench_models.py" ]; then
         miters=$(( iters / 4 > 3 ? iters / 4 : 3 ))
         echo "== run $run/$runs: peer $peer_dir/bench_models.py resnet50 8 224 infer nhwc $miters $threads"
         if pm=$(/usr/bin/python3 "$peer_dir/bench_models.py" resnet50 8 224 infer nhwc \
                    "$miters" "$threads"); then
            echo "$pm" | awk '/^img\/s/ { printf "resnet50_infer_b8 nhwc %.3f\n", 8000 / $2 }' |
               tee -a "$out/peer.txt"
         else
            echo "bench: $peer_dir/bench_models.py failed" >&2
            status=1
         fi
      fi
   fi
done

echo "== comparison (ratio = peer ms / lumen ms; > 1 means lumen is faster)"
luajit bench/compare "$out/lumen.txt" "$out/peer.txt" || status=1
exit $status
