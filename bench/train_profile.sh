#!/usr/bin/env bash
# bench/train_profile.sh -- where the resnet50 training step's time goes, lumen beside PyTorch 2.x:
# bench/train_profile.lua (lumen, every op timed) and bench/peer_train_profile.py (the same step
# under torch.profiler), alternately, RUNS times (default 3), then one table per variant:
# each op row's median over the runs, lumen ms, PyTorch ms, the difference, and the same rows
# summed into phases (convolution forward, backward data, backward weight, batch norm,
# elementwise, pools/linear/loss, optimizer, allocation/collection, casts, framework).
#   bash bench/train_profile.sh [threads] [steps] [f32|bf16|both]
# threads 2, steps 5 (timed steps per run, plain and profiled), both by default. PEER2_PY is
# the peer's python (default: the one ../shared/peer/setup_torch2.sh prints, or
# ~/.cache/lumen-peer-torch2/bin/python); NO_PEER=1 runs lumen alone. Files in $BENCH_OUT
# (default /tmp/lumen-train-profile): lumen_<variant>.txt, peer_<variant>.txt (every run's lines).
# STAT=min prints each row's minimum over the runs instead of its median. NO_RUN=1 prints the
# tables of the files already there (another STAT, say) without running anything.
# OpenMP: the peer gets lumen's GOMP_SPINCOUNT (below). The machine is shared: read differences of a few percent of the step as noise, and compare the
# plain 'step' rows with bench/amp.sh's resnet50_train rows.
set -u
cd "$(dirname "$0")/.." || exit 2
threads=${1:-2}
steps=${2:-5}
which=${3:-both}
runs=${RUNS:-3}
out=${BENCH_OUT:-/tmp/lumen-train-profile}
peer_dir=${PEER_DIR:-../shared/peer}
case "$which" in
   f32) variants=(f32) ;;
   bf16) variants=(bf16) ;;
   both) variants=(f32 bf16) ;;
   *) echo "usage: bash bench/train_profile.sh [threads] [steps] [f32|bf16|both]" >&2; exit 2 ;;
esac
mkdir -p "$out"
py=${PEER2_PY:-}
if [ -z "$py" ] && [ -z "${NO_PEER:-}" ]; then
   if [ -f "$peer_dir/setup_torch2.sh" ]; then
      py=$(bash "$peer_dir/setup_torch2.sh") || py=
   elif [ -x "$HOME/.cache/lumen-peer-torch2/bin/python" ]; then
      py=$HOME/.cache/lumen-peer-torch2/bin/python
   fi
   [ -n "$py" ] || echo "bench: no PyTorch 2.x peer (set PEER2_PY)" >&2
fi
# OpenMP: bin/lumen sets GOMP_SPINCOUNT=1000 when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is
# set (lua/lumen/C.lua); the peer (PyTorch's wheels use libgomp too) gets the same unless
# PEER_OMP_DEFAULT=1. On a loaded machine libgomp's default spinning at every barrier made
# PyTorch's step several times slower (batch norm 40x), which says nothing about its kernels.
peer_env=()
if [ -z "${PEER_OMP_DEFAULT:-}" ] && [ -z "${GOMP_SPINCOUNT:-}" ] && [ -z "${OMP_WAIT_POLICY:-}" ]; then
   peer_env=(GOMP_SPINCOUNT=1000)
fi
status=0
if [ -n "${NO_RUN:-}" ]; then
   runs_done=$(grep -c '^step|' "$out/lumen_${variants[0]}.txt" 2>/dev/null || echo 0)
   runs=$runs_done
else
   for v in "${variants[@]}"; do
      : > "$out/lumen_$v.txt"
      : > "$out/peer_$v.txt"
   done
fi
echo "== threads $threads, steps $steps, $runs runs; peer OpenMP: ${peer_env[*]:-the PyTorch default}"
for run in $(seq 1 "$runs"); do
   [ -n "${NO_RUN:-}" ] && break
   for v in "${variants[@]}"; do
      word=; [ "$v" = bf16 ] && word=bf16
      echo "== run $run/$runs $v: lumen bench/train_profile.lua (threads $threads, steps $steps," \
           "load $(cut -d' ' -f1-3 /proc/loadavg))"
      OMP_NUM_THREADS=$threads bin/lumen bench/train_profile.lua "$threads" "$steps" $word \
         >> "$out/lumen_$v.txt" || { echo "bench: train_profile.lua failed" >&2; status=1; }
      if [ -n "$py" ]; then
         echo "== run $run/$runs $v: peer bench/peer_train_profile.py (load" \
              "$(cut -d' ' -f1-3 /proc/loadavg))"
         env OMP_NUM_THREADS="$threads" "${peer_env[@]}" "$py" bench/peer_train_profile.py "$threads" "$steps" $word \
            2>/dev/null >> "$out/peer_$v.txt" ||
            { echo "bench: peer_train_profile.py failed" >&2; status=1; }
      fi
   done
done
for v in "${variants[@]}"; do
   echo
   echo "== $v: ${STAT:-median}s of $runs runs, ms per step (difference = lumen - PyTorch; ratio = PyTorch / lumen)"
   luajit - "$out/lumen_$v.txt" "$out/peer_$v.txt" <<'LUA' || status=1
local function read(path)
   local rows, order = {}, {}
   local f = io.open(path)
   if not f then return rows, order end
   for line in f:lines() do
      local k, v = line:match("^([^#][^|]*)|([-%d.eE+]+)$")
      if k then
         if not rows[k] then rows[k] = {}; order[#order + 1] = k end
         table.insert(rows[k], tonumber(v))
      end
   end
   f:close()
   return rows, order
end
-- each row's median over the runs (STAT=min: its minimum, the least disturbed run of a loaded
-- machine)
local use_min = os.getenv("STAT") == "min"
local function med(t)
   if not t or #t == 0 then return nil end
   local c = {}
   for i = 1, #t do c[i] = t[i] end
   table.sort(c)
   local n = #c
   if use_min then return c[1] end
   return n % 2 == 1 and c[(n + 1) / 2] or (c[n / 2] + c[n / 2 + 1]) / 2
end
local L, lorder = read(arg[1])
local P, porder = read(arg[2])
local function fmt(v) return v and string.format("%9.1f", v) or "        -" end
local function line(name, a, b)
   local d = (a and b) and string.format("%+9.1f", a - b) or "         "
   local r = (a and b and a > 0) and string.format("%6.2f", b / a) or "      "
   print(string.format("  %-40s %s %s %s %s", name:sub(1, 40), fmt(a), fmt(b), d, r))
end
print(string.format("  %-40s %9s %9s %9s %6s", "row", "lumen", "PyTorch", "diff", "ratio"))
line("step (plain; median of its steps)", med(L["step"]), med(P["step"]))
line("profiled step", med(L["profiled step"]), med(P["profiled step"]))
local ls, lp = med(L["step"]), med(L["profiled step"])
local ps, pp = med(P["step"]), med(P["profiled step"])
print(string.format("  (profiling inflates the step: lumen %s, PyTorch %s)",
   (ls and lp) and string.format("%+.1f %%", (lp / ls - 1) * 100) or "-",
   (ps and pp) and string.format("%+.1f %%", (pp / ps - 1) * 100) or "-"))
-- op rows: the union, by the larger median first
local names, seen = {}, {}
for _, src in ipairs({ lorder, porder }) do
   for _, k in ipairs(src) do
      if (k:find("^op:") or k:find("^other %(")) and not seen[k] then
         seen[k] = true
         names[#names + 1] = k
      end
   end
end
local function val(t, k) return med(t[k]) end
table.sort(names, function(a, b)
   return math.max(val(L, a) or 0, val(P, a) or 0) > math.max(val(L, b) or 0, val(P, b) or 0)
end)
print("  -- by op (self time per step)")
for _, k in ipairs(names) do line(k:gsub("^op:", ""), val(L, k), val(P, k)) end
-- phases
local PHASE = {
   { "convolution forward", { "conv forward" } },
   { "convolution backward data", { "conv backward data" } },
   { "convolution backward weight", { "conv backward weight" } },
   { "convolution backward, unsplit / glue", { "conv backward (data + weight)",
                                               "conv backward (node: Lua, checks)" } },
   { "batch norm (forward + backward)", { "batch norm forward", "batch norm backward" } },
   { "elementwise (relu, residual add, grad sums)", { "relu forward", "relu backward",
       "add forward (residual)", "add backward (residual)", "gradient accumulation" } },
   { "pools, linear, loss (fwd + bwd)", { "max_pool2d forward", "max_pool2d backward",
       "adaptive_avg_pool2d forward", "adaptive_avg_pool2d backward", "linear forward",
       "linear backward", "cross_entropy forward", "cross_entropy backward", "flatten/view" } },
   { "optimizer (step + zero_grad)", { "optimizer step", "zero_grad" } },
   { "allocation/collection", { "allocation/collection" } },
   { "dtype casts (bf16)", { "dtype casts (bf16)" } },
}
local used = {}
print("  -- by phase (sums of the op rows above)")
local function sum(t, list)
   local s, any = 0, false
   for _, r in ipairs(list) do
      used["op:" .. r] = true
      local v = val(t, "op:" .. r)
      if v then s, any = s + v, true end
   end
   return any and s or nil
end
for _, p in ipairs(PHASE) do
   local a, b = sum(L, p[2]), sum(P, p[2])
   if a or b then line(p[1], a or 0, b or 0) end
end
local fa, fb = 0, 0
for _, k in ipairs(names) do
   if not used[k] then fa, fb = fa + (val(L, k) or 0), fb + (val(P, k) or 0) end
end
line("framework (engine, Lua/Python, other ops)", fa, fb)
-- forward and backward as wholes (the rows named so; the backward with the gradient sums and
-- the engine)
local fw, bw = { 0, 0 }, { 0, 0 }
for _, k in ipairs(names) do
   local acc = k:find(" forward") and fw or
      (k:find("backward") or k:find("gradient accumulation") or k:find("engine")) and bw or nil
   if acc then acc[1], acc[2] = acc[1] + (val(L, k) or 0), acc[2] + (val(P, k) or 0) end
end
line("= forward ops (all '... forward' rows)", fw[1], fw[2])
line("= backward ops (with grad sums, engine)", bw[1], bw[2])
-- the convolutions by shape: lumen's self times beside oneDNN's primitive times (PyTorch's
-- profiler does not see into its convolution backward; oneDNN's own timing leaves out the
-- framework around each primitive, so PyTorch's side reads a little low)
local function readshapes(path)
   local t = {}
   local f = io.open(path)
   if not f then return t end
   for l in f:lines() do
      local k, a, b, c = l:match("^shape:([^|]+)|([-%d.]+)|([-%d.]+)|([-%d.]+)|")
      if k then
         t[k] = t[k] or { {}, {}, {} }
         table.insert(t[k][1], tonumber(a))
         table.insert(t[k][2], tonumber(b))
         table.insert(t[k][3], tonumber(c))
      end
   end
   f:close()
   return t
end
local LS, PS = readshapes(arg[1]), readshapes(arg[2])
local keys = {}
for k in pairs(LS) do keys[#keys + 1] = k end
if #keys > 0 then
   local function tot(t, k)
      local e = t[k]
      if not e then return 0 end
      return (med(e[1]) or 0) + (med(e[2]) or 0) + (med(e[3]) or 0)
   end
   table.sort(keys, function(a, b) return tot(LS, a) > tot(LS, b) end)
   print("  -- convolutions by shape, ms per step: forward / backward data / backward weight, " ..
         "lumen vs PyTorch (oneDNN's primitive times)")
   local function c3(e, i)
      local v = e and med(e[i])
      return v and string.format("%6.1f", v) or "     -"
   end
   for _, k in ipairs(keys) do
      local l, p = LS[k], PS[k]
      print(string.format("  %-28s fwd %s %s | bwd data %s %s | bwd weight %s %s | all %6.2f",
         k, c3(l, 1), c3(p, 1), c3(l, 2), c3(p, 2), c3(l, 3), c3(p, 3),
         tot(LS, k) > 0 and tot(PS, k) / tot(LS, k) or 0))
   end
end
for _, k in ipairs(porder) do
   if k:find("^onednn:") then print(string.format("  PyTorch %s: %.1f ms", k, med(P[k]))) end
end
LUA
   grep -h '^#' "$out/lumen_$v.txt" | tail -1
done
exit $status
