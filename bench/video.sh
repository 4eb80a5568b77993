#!/usr/bin/env bash
# bench/video.sh -- 3-D (video) operators and r3d_18 beside PyTorch 2.x, in one run: the
# benchmark figures of issue 19 (docs/performance.md, "3-D (video) operators").
#   bash bench/video.sh [threads] [iters]
# RUNS times (default 3), alternately:
# 1. lumen: bench/video_ops.lua (conv3d of r3d_18's layers and r2plus1d's (2+1)-D pair, forward
#    and forward+backward; max/avg/adaptive-avg pool3d and BatchNorm3d; batch 2 of 8x112x112
#    clips; each row in ncdhw and ndhwc = channels_last_3d) and bench/video_models.lua (r3d_18,
#    batch VIDEO_BATCH (default 2) of 3x8x112x112: inference and one SGD training step, both
#    formats; skipped, with a message, while lm.models.r3d_18 does not exist)
# 2. the peer, a current PyTorch from ../shared/peer/setup_torch2.sh (PEER2_PY overrides its
#    python): bench/peer_video.py (the same operator rows) and ../shared/peer/bench_models.py
#    r3d_18 (torchvision's; nhwc there means channels_last_3d), its clips/s turned into the same
#    '<row> <fmt> <ms per batch>' line
# then bench/compare (ratio = peer ms / lumen ms; > 1: lumen is faster), lumen's own speed-up of
# ndhwc over ncdhw per row (ncdhw ms / ndhwc ms; < 1 is flagged), and r3d_18 in clips/s.
# MODEL_ITERS (default 3) timed steps per r3d_18 row on both sides, after two warm-ups; NO_MODELS=1
# leaves r3d_18 out (it takes most of the time), NO_PEER=1 the peer. Files in $BENCH_OUT (default
# /tmp/lumen-video): lumen.txt, peer.txt.
set -u
cd "$(dirname "$0")/.." || exit 2
threads=${1:-2}
iters=${2:-10}
runs=${RUNS:-3}
miters=${MODEL_ITERS:-3}
batch=${VIDEO_BATCH:-2}
out=${BENCH_OUT:-/tmp/lumen-video}
peer_dir=${PEER_DIR:-../shared/peer}
if [ ! -d "$peer_dir" ] && common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null)
then
   # a git worktree outside the main checkout: the shared folder beside the main checkout
   [ -d "$(dirname "$common")/../shared/peer" ] && peer_dir=$(dirname "$common")/../shared/peer
fi
mkdir -p "$out"
: > "$out/lumen.txt"
: > "$out/peer.txt"
status=0
py=${PEER2_PY:-}
if [ -z "$py" ] && [ -z "${NO_PEER:-}" ]; then
   py=$(bash "$peer_dir/setup_torch2.sh") || { echo "bench: no PyTorch 2.x peer" >&2; py=; }
fi
[ -n "${NO_PEER:-}" ] && py=
# bench_models.py prints "img/s N" (clips/s for a video model): turn it into '<row> <fmt> <ms>'
peer_model() { # mode fmt(ndhwc|ncdhw)
   local r pfmt=nchw
   [ "$2" = ndhwc ] && pfmt=nhwc
   if r=$(OMP_NUM_THREADS=$threads "$py" "$peer_dir/bench_models.py" r3d_18 "$batch" 112 "$1" \
             "$pfmt" "$miters" "$threads"); then
      echo "$r" | awk -v row="r3d_18_$1_b$batch" -v fmt="$2" -v b="$batch" \
         '/^img\/s/ { printf "%s %s %.3f\n", row, fmt, 1000 * b / $2 }'
   else
      echo "bench: bench_models.py r3d_18 $1 $pfmt failed" >&2
      return 1
   fi
}
have_r3d=
for run in $(seq 1 "$runs"); do
   echo "== run $run/$runs: lumen bench/video_ops.lua (threads $threads, iters $iters)"
   OMP_NUM_THREADS=$threads bin/lumen bench/video_ops.lua "$threads" "$iters" |
      tee -a "$out/lumen.txt" || status=1
   if [ -z "${NO_MODELS:-}" ]; then
      echo "== run $run/$runs: lumen bench/video_models.lua (r3d_18 batch $batch, $miters steps)"
      if m=$(OMP_NUM_THREADS=$threads bin/lumen bench/video_models.lua "$threads" "$miters" \
                "$batch"); then
         echo "$m" | tee -a "$out/lumen.txt"
         case "$m" in *skipped*) have_r3d= ;; *) have_r3d=1 ;; esac
      else
         echo "$m"
         echo "bench: bench/video_models.lua failed" >&2
         status=1
      fi
   fi
   if [ -n "$py" ]; then
      echo "== run $run/$runs: peer $("$py" -c 'import torch; print("PyTorch", torch.__version__)')"
      OMP_NUM_THREADS=$threads "$py" bench/peer_video.py "$threads" "$iters" |
         tee -a "$out/peer.txt" || status=1
      if [ -n "$have_r3d" ]; then
         echo "== run $run/$runs: peer $peer_dir/bench_models.py r3d_18 $batch 112 ($miters steps)"
         {
            peer_model infer ndhwc
            peer_model infer ncdhw
            peer_model train ndhwc
            peer_model train ncdhw
         } | tee -a "$out/peer.txt" || status=1
      fi
   fi
done
echo "== comparison (ratio = peer ms / lumen ms; > 1 means lumen is faster)"
luajit bench/compare "$out/lumen.txt" "$out/peer.txt" || status=1
echo "== lumen ndhwc (channels_last_3d) speed-up over lumen ncdhw (medians; ncdhw ms / ndhwc ms)"
luajit - "$out/lumen.txt" "$out/peer.txt" "$batch" <<'LUA' || status=1
local function read(path)
   local rows, order = {}, {}
   local f = io.open(path, "r")
   if not f then return rows, order end
   for line in f:lines() do
      local k, fmt, v = line:match("^(%S+) (%S+) ([%d.]+)$")
      if k and (fmt == "ndhwc" or fmt == "ncdhw") then
         if not rows[k] then rows[k] = {}; order[#order + 1] = k end
         rows[k][fmt] = rows[k][fmt] or {}
         table.insert(rows[k][fmt], tonumber(v))
      end
   end
   f:close()
   return rows, order
end
local function med(t)
   if not t then return nil end
   table.sort(t)
   local n = #t
   return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2
end
local lumen, order = read(arg[1])
local peer = read(arg[2])
local batch = tonumber(arg[3])
local slower = {}
print(string.format("%-46s %11s %11s %8s", "row", "ncdhw ms", "ndhwc ms", "speed-up"))
for _, k in ipairs(order) do
   local a, b = med(lumen[k].ncdhw), med(lumen[k].ndhwc)
   if a and b then
      local s = a / b
      print(string.format("%-46s %11.3f %11.3f %7.2fx%s", k, a, b, s, s < 1 and "  SLOWER" or ""))
      if s < 1 then slower[#slower + 1] = k end
   end
end
print(#slower == 0 and "ndhwc is faster than ncdhw on every row" or
      ("ndhwc is slower than ncdhw on " .. #slower .. " row(s): " .. table.concat(slower, ", ")))
local any = false
for _, k in ipairs(order) do
   if k:match("^r3d_18_") then
      if not any then
         print("== r3d_18, clips/s (batch " .. batch .. "; ratio = lumen clips/s / peer clips/s)")
         any = true
      end
      for _, fmt in ipairs({ "ndhwc", "ncdhw" }) do
         local l = med(lumen[k][fmt])
         local p = peer[k] and med(peer[k][fmt])
         if l then
            print(string.format("%-22s %s  lumen %7.2f clips/s  PyTorch %s%s", k, fmt,
                                1000 * batch / l,
                                p and string.format("%7.2f clips/s", 1000 * batch / p) or "-",
                                p and string.format("  ratio %.2f", p / l) or ""))
         end
      end
   end
end
LUA
exit $status
