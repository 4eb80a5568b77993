#!/usr/bin/env bash
# bench/bf16_models.sh -- models under bfloat16 autocast beside PyTorch 2.x, alternating in one run:
# bench/bf16_models.lua (lumen) and ../shared/peer/bench_models.py's "bf16" variant
# (torch.autocast("cpu", dtype=torch.bfloat16): oneDNN, on AMX tiles where the CPU has them).
#   bash bench/bf16_models.sh [threads] [iters] [CONFIG ...]
# CONFIG is MODEL:BATCH:RES:MODE (default: resnet50:8:224:infer resnet50:8:224:train
# resnet50:1:224:infer resnet50:32:224:infer resnet18:8:224:infer r3d_18:2:112:infer).
# RUNS (default 3) alternations; prints each run's pair, then per config the medians and the
# ratio PyTorch ms / lumen ms (> 1: lumen is faster). PEER2_PY overrides the peer's python.
set -u
cd "$(dirname "$0")/.." || exit 2
threads=${1:-2}
iters=${2:-5}
shift 2 2>/dev/null || shift $#
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(resnet50:8:224:infer resnet50:8:224:train resnet50:1:224:infer
                                     resnet50:32:224:infer resnet18:8:224:infer r3d_18:2:112:infer)
runs=${RUNS:-3}
py=${PEER2_PY:-$(bash ../shared/peer/setup_torch2.sh)} || { echo "bench: no PyTorch 2.x peer" >&2; exit 2; }
med() { sort -n | awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]; else print "nan"}'; }
for c in "${configs[@]}"; do
   IFS=: read -r model batch res mode <<< "$c"
   l=(); p=()
   for r in $(seq "$runs"); do
      lm=$(bin/lumen bench/bf16_models.lua "$model" "$batch" "$res" "$mode" "$iters" "$threads" |
           awk '/ nhwc /{print $3}')
      pk=$("$py" ../shared/peer/bench_models.py "$model" "$batch" "$res" "$mode" nhwc "$iters" \
           "$threads" bf16 | awk -v b="$batch" '/^img\/s/{printf "%.3f", b * 1000 / $2}')
      echo "$c run $r: lumen ${lm:-nan} ms, PyTorch ${pk:-nan} ms"
      l+=("${lm:-nan}"); p+=("${pk:-nan}")
   done
   ml=$(printf '%s\n' "${l[@]}" | med); mp=$(printf '%s\n' "${p[@]}" | med)
   echo "== $c: lumen $ml ms, PyTorch $mp ms, ratio $(awk -v a="$mp" -v b="$ml" 'BEGIN {printf "%.2f", a / b}')"
done
