#!/usr/bin/env bash
# bench/families.sh -- the model families beside PyTorch 2.x eager in one run (issue 40's speed
# row): float32, channels-last, torchvision's default options, bench/families.lua (lumen) and
# ../shared/peer/bench_models.py (`MODEL BATCH RES MODE nhwc ITERS THREADS`, its eager variant),
# alternating.
#   bash bench/families.sh [threads] [iters] [CONFIG ...]
# CONFIG is MODEL:BATCH:RES:MODE, MODE infer or train (default: mobilenet_v2, mobilenet_v3_large,
# efficientnet_b0, convnext_tiny and regnet_y_400mf, each :8:224:infer and :8:224:train).
# RUNS (default 3) alternations per config, lumen first in odd runs and PyTorch first in even
# ones; each side times ITERS steps after two warm-ups and reports their median. An infer config
# gives two lumen rows: the model in eval mode as built, and "folded" (lm.nn.fold_batch_norm,
# what lumen users deploy; PyTorch's eager mode does not fold, so both rows face the same
# PyTorch number; convnext_tiny has no batch norm and no folded row). Prints each run, then per
# row the medians over the runs (and their range) and the ratio PyTorch ms / lumen ms (> 1:
# lumen is faster), and last a markdown table for docs/performance.md with the command, the
# versions, the CPU and the load average before the run (it warns on stderr when that is 1 or
# more: measure on an idle machine). PEER2_PY overrides the peer's python.
set -u
cd "$(dirname "$0")/.." || exit 2
threads=${1:-2}
iters=${2:-5}
shift 2 2>/dev/null || shift $#
configs=("$@")
if [ ${#configs[@]} -eq 0 ]; then
   for m in mobilenet_v2 mobilenet_v3_large efficientnet_b0 convnext_tiny regnet_y_400mf; do
      configs+=("$m:8:224:infer" "$m:8:224:train")
   done
fi
runs=${RUNS:-3}
# other jobs on the cores make the numbers meaningless, PyTorch's most: with a co-thread
# descheduled its 2-thread OpenMP steps took 10-100x their time on a loaded 2-core host
load0=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null)
awk -v l="${load0:-0}" 'BEGIN {exit !(l + 0 >= 1)}' &&
   echo "bench: load average $load0 before the run: other jobs share the CPU; measure on an idle machine" >&2
[ -f build/liblumen.so ] || { echo "bench: build lumen first (make)" >&2; exit 2; }
py=${PEER2_PY:-$(bash ../shared/peer/setup_torch2.sh)} || { echo "bench: no PyTorch 2.x peer" >&2; exit 2; }
peer=../shared/peer/bench_models.py
med() { sort -g | awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]; else print "nan"}'; }
range() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {if (NR) print lo "-" hi; else print "nan"}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "nan"}'; }

table=()   # markdown rows
nok=0; nrows=0
for c in "${configs[@]}"; do
   IFS=: read -r model batch res mode <<< "$c"
   if [ "$mode" != infer ] && [ "$mode" != train ]; then
      echo "bench: $c: MODE must be infer or train" >&2; exit 2
   fi
   declare -A lt=()   # lumen row tag -> its times, one a line
   tags=(); p=()
   for r in $(seq "$runs"); do
      lumen() { bin/lumen bench/families.lua "$model" "$batch" "$res" "$mode" "$iters" "$threads"; }
      torch() {
         "$py" "$peer" "$model" "$batch" "$res" "$mode" nhwc "$iters" "$threads" eager |
            awk -v b="$batch" '/^img\/s/ {printf "%.3f", b * 1000 / $2}'
      }
      if [ $((r % 2)) -eq 1 ]; then lo=$(lumen); pk=$(torch); else pk=$(torch); lo=$(lumen); fi
      [ "$r" -eq 1 ] && printf '%s\n' "$lo" | grep '^#'
      line="$c run $r:"; got=0
      while read -r tag _ ms; do
         [ -n "${lt[$tag]+x}" ] || { tags+=("$tag"); lt[$tag]=""; }
         lt[$tag]+="$ms"$'\n'
         line+=" lumen ${tag#"${model}"_} $ms ms,"; got=$((got + 1))
      done < <(printf '%s\n' "$lo" | awk '/ nhwc / {print $1, $2, $3}')
      [ "$got" -eq 0 ] && line+=" lumen nan,"
      echo "$line PyTorch ${pk:-nan} ms"
      p+=("${pk:-nan}")
   done
   mp=$(printf '%s\n' "${p[@]}" | med); rp=$(printf '%s\n' "${p[@]}" | range)
   [ ${#tags[@]} -eq 0 ] && { tags=("${model}_${mode}_b${batch}"); lt[${tags[0]}]="nan"; }
   for tag in "${tags[@]}"; do
      ml=$(printf '%s' "${lt[$tag]}" | med); rl=$(printf '%s' "${lt[$tag]}" | range)
      q=$(ratio "$mp" "$ml")
      case $tag in
         *_infer_folded_*) what="infer, folded" ;;
         *_infer_*) what="infer, eval" ;;
         *) what="train step" ;;
      esac
      echo "== $c $what: lumen $ml ms ($rl), PyTorch $mp ms ($rp), ratio $q"
      table+=("| $model | $batch | $res | $what | $ml ($rl) | $mp ($rp) | $q |")
      nrows=$((nrows + 1))
      awk -v q="$q" 'BEGIN {exit !(q ~ /^[0-9.]+$/ && q + 0 >= 1.2)}' && nok=$((nok + 1))
   done
   unset lt
done

rev=$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo "+changes")
tv=$("$py" -c 'import torch, torchvision; print(torch.__version__, "/ torchvision", torchvision.__version__)' 2>/dev/null)
cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null)
args=("$threads" "$iters")
[ $# -gt 0 ] && args+=("$@")
echo
echo "\`RUNS=$runs bash bench/families.sh ${args[*]}\` ($(date +%Y-%m-%d); lumen $rev, PyTorch ${tv:-?} eager; ${cpu:-unknown CPU}, $threads threads, load average ${load0:-?} before the run): float32, channels-last, milliseconds per batch, median of $runs alternating runs (each the median of $iters timed steps after two warm-ups), range over the runs in parentheses; ratio = PyTorch ms / lumen ms (> 1: lumen faster). Folded: after lm.nn.fold_batch_norm, beside the same PyTorch eager number."
echo
echo "| model | batch | res | mode | lumen ms | PyTorch ms | ratio |"
echo "|---|---:|---:|---|---:|---:|---:|"
printf '%s\n' "${table[@]}"
echo
echo "rows at >= 1.2x: $nok of $nrows"
