-- lumen.doc -- the docstrings of lumen's public API: ONE table that both the REPL's help
-- (`help(lm.zeros)`, `?lm.zeros`, lua/lumen/repl.lua) and docs/api.md (made by
-- tools/gen_api.lua: `bin/lumen tools/gen_api.lua > docs/api.md`) are made from.
-- spec/api_doc_spec.lua checks that every public name has an entry here and that docs/api.md is
-- up to date: a new public function needs an entry, then `bin/lumen tools/gen_api.lua >
-- docs/api.md`.
--
-- Entry names: `lm.zeros`, `lm.nn.Conv2d`, `lm.F.conv2d` (= lm.nn.functional.conv2d),
-- `Tensor:add` (a method of lm.Tensor), `Tensor.requires_grad` (a field), `Module:forward`
-- (lm.nn.Module), `Optimizer:step` (lm.optim.Optimizer).
-- Entry fields: sig (the call, with `-> result`), desc (one line), and optionally opts (the
-- options with their defaults), fmt (memory-format behaviour), err (the errors raised), note.
--
-- Loading this module loads nothing else; help() only looks at the lumen modules already loaded.

local M = {}

M.sections = {}      -- { {id =, title =, intro =, entries = {entry...}} ...} in document order
M.entries = {}       -- name -> entry
M.list = {}          -- every entry, in document order

local section

local function S(id, title, intro)
   section = { id = id, title = title, intro = intro, entries = {} }
   M.sections[#M.sections + 1] = section
end

local function E(name, sig, desc, more)
   assert(M.entries[name] == nil, "lumen.doc: two entries named " .. name)
   local e = { name = name, sig = sig, desc = desc, section = section.id }
   if more then
      for k, v in pairs(more) do e[k] = v end
   end
   section.entries[#section.entries + 1] = e
   M.entries[name] = e
   M.list[#M.list + 1] = e
   return e
end

-- ---------------------------------------------------------------------------------------------
-- the entries. Shared phrases first.

local OPTS = "a trailing table {dtype = lm.float32, device = \"cpu\", memory_format = "
   .. "lm.contiguous_format, requires_grad = false}"
local OPTS_LIKE = "{dtype = t's dtype, device = t's device, memory_format = lm.preserve_format, "
   .. "requires_grad = false}"
local ERR_OPTS = "options that are not a table, an unknown dtype, memory format or device, "
   .. "preserve_format (only *_like and clone accept it), bad sizes (not integers, negative, "
   .. "more than 8 dims, sizes whose element count or strides overflow int64), a key the function "
   .. "does not know (`lumen.<name>: unknown option 'paddding'`): `lumen.<name>: <problem>`"
local FMT_NEW = "the result is contiguous, or in opts.memory_format (channels_last needs 4-D "
   .. "sizes, channels_last_3d 5-D)"
local FMT_LIKE = "preserve_format by default: t's strides when t is non-overlapping and dense, "
   .. "else the format t:suggest_memory_format() names"
local FMT_EW = "the output layout follows the inputs by the memory-format rules "
   .. "(docs/memory_formats.md, \"the layout of elementwise results\"): a channels-last input "
   .. "gives a channels-last result"
local ERR_EW = "an argument that is neither a tensor nor a number, shapes that do not broadcast, "
   .. "a dtype the op does not take: `lumen.<name>: <problem>`"
local FMT_VIEW = "a view: shares t's storage, strides derived from t's (a channels-last input "
   .. "gives a view with permuted strides, not a copy)"
local FMT_RED = "the result is contiguous, also for a channels-last input (as PyTorch 1.13 "
   .. "allocates reductions); a full reduction is a 0-d tensor"
local ERR_DIM = "a dim out of range (`dim 5 out of range for a 4-dimensional tensor`), a "
   .. "non-integer dim"

S("conventions", "Conventions", [[
`local lm = require("lumen")`. Dims and indices are 1-based (`t:size(1)` is N), negative dims
count from the end. Logical dim order is N, C, H, W (N, C, D, H, W): a channels-last tensor is
NCHW logically and NHWC in memory, as in PyTorch. Sizes and strides are Lua arrays in logical
order, strides in elements. Options are a trailing table. Bad input raises a Lua error
`lumen.<function>: <problem>` at the caller's line (`pcall` returns `false, msg`); nothing a script
passes crashes the process. The memory-format rules are in docs/memory_formats.md.]])
E("lm", "lm = require(\"lumen\")", "The lumen namespace: tensors, creation, math, and the "
   .. "parts loaded on first use (lm.nn, lm.F, lm.optim, lm.layout, lm.data, lm.models, "
   .. "lm.serialize, lm.checkpoint, lm.save/load, lm.save_checkpoint/load_checkpoint, "
   .. "lm.to_channels_last, lm.amp).", { note = "lm.autograd and lm.autocast are loaded with "
   .. "lumen (they wrap the Tensor methods); the others when first touched." })
E("lm._VERSION", "lm._VERSION -> string", "lumen's version, e.g. \"0.1.0\".")

S("constants", "Constants: dtypes and memory formats", [[
Dtypes and memory formats are tables with `__tostring` (`tostring(lm.float32) == "float32"`,
`tostring(lm.channels_last) == "channels_last"`). Where a dtype or format is expected, its name
as a string is accepted too.]])
E("lm.float32", "lm.float32", "32-bit float dtype: the default for creation and for numbers.")
E("lm.float64", "lm.float64", "64-bit float dtype.")
E("lm.float16", "lm.float16", "16-bit IEEE half dtype (storage and conversion; math converts "
   .. "through float32).")
E("lm.bfloat16", "lm.bfloat16", "16-bit brain-float dtype (storage and conversion).")
E("lm.int64", "lm.int64", "64-bit integer dtype: indices (argmax, randint, class targets).")
E("lm.int32", "lm.int32", "32-bit integer dtype.")
E("lm.uint8", "lm.uint8", "8-bit unsigned dtype (images).")
E("lm.bool", "lm.bool", "Boolean dtype (comparisons, masks).")
E("lm.contiguous_format", "lm.contiguous_format", "Row-major (NCHW) memory format: the "
   .. "default.")
E("lm.channels_last", "lm.channels_last", "NHWC memory format for 4-D tensors: strides "
   .. "{H*W*C, 1, W*C, C}.")
E("lm.channels_last_3d", "lm.channels_last_3d", "NDHWC memory format for 5-D tensors.")
E("lm.preserve_format", "lm.preserve_format", "Keep the input's layout (the default of "
   .. "*_like and clone); not a layout of its own.")
E("lm.dtypes", "lm.dtypes", "The dtype and format tables (lua/lumen/dtype.lua): "
   .. "lm.dtypes.dtypes lists every dtype; lookup(x) / lookup_format(x) turn a name or table "
   .. "into a dtype / format (nil, message when unknown).",
   { note = "a helper module shared by lumen's modules; its other members are internal." })
E("lm.format", "lm.format", "The printer behind tostring(tensor) (lua/lumen/format.lua); "
   .. "lm.format.options holds the print options (precision, edge items).",
   { note = "a helper module; tostring(t) is the public way in." })
E("lm.tensor_mt", "lm.tensor_mt", "The metatable every tensor shares (__index = lm.Tensor, "
   .. "the arithmetic operators, __tostring).",
   { note = "for modules that must recognise tensors; lm.is_tensor(x) is the public test." })

S("creation", "Creation", [[
Sizes are one array (`{2, 3}`) or leading integers (`lm.zeros(2, 3)`); a 0-d tensor has
sizes `{}`. At most 8 dims.]])
E("lm.empty", "lm.empty(sizes, opts) -> Tensor", "A new tensor with uninitialised values.",
   { opts = OPTS, fmt = FMT_NEW, err = ERR_OPTS })
E("lm.zeros", "lm.zeros(sizes, opts) -> Tensor", "A new tensor filled with 0.",
   { opts = OPTS, fmt = FMT_NEW, err = ERR_OPTS })
E("lm.ones", "lm.ones(sizes, opts) -> Tensor", "A new tensor filled with 1.",
   { opts = OPTS, fmt = FMT_NEW, err = ERR_OPTS })
E("lm.full", "lm.full(sizes, value, opts) -> Tensor", "A new tensor filled with value (a number; "
   .. "a boolean gives a bool tensor).",
   { opts = OPTS, fmt = FMT_NEW, err = "sizes not a table; value not a number or boolean; "
   .. "a value the dtype cannot hold (NaN, inf or out of range for an integer dtype, a finite "
   .. "value beyond a float dtype's range): `lumen.full: value cannot be converted to type "
   .. "int32 without overflow`, as PyTorch; " .. ERR_OPTS })
E("lm.rand", "lm.rand(sizes, opts) -> Tensor", "Uniform random values in [0, 1) from the global "
   .. "generator (lm.manual_seed).", { opts = OPTS, fmt = FMT_NEW,
   err = "a non-floating dtype; " .. ERR_OPTS })
E("lm.randn", "lm.randn(sizes, opts) -> Tensor", "Standard normal random values.",
   { opts = OPTS, fmt = FMT_NEW, err = "a non-floating dtype; " .. ERR_OPTS })
E("lm.randint", "lm.randint(low, high, sizes, opts) / lm.randint(high, sizes, opts) -> Tensor",
   "Random integers in [low, high) (low defaults to 0); int64 unless opts.dtype.",
   { opts = OPTS .. " (dtype default int64)", fmt = FMT_NEW,
   err = "low/high not integers, high <= low (`random_ expects 'from' ... to be less than "
   .. "'to'`), sizes not a table; " .. ERR_OPTS })
E("lm.arange", "lm.arange(stop, opts) / lm.arange(start, stop, step, opts) -> Tensor",
   "The 1-D range start, start + step, ... up to but excluding stop (start 0, step 1); int64 when "
   .. "every argument is an integer, else float32 (as PyTorch).",
   { opts = OPTS, err = "non-numbers, step 0, a step whose sign cannot reach stop, more than "
   .. "2^50 elements, options not last" })
E("lm.linspace", "lm.linspace(start, stop, steps, opts) -> Tensor", "steps evenly spaced values "
   .. "from start to stop inclusive (float32 unless opts.dtype).",
   { opts = OPTS, err = "non-numbers, steps not a non-negative integer" })
E("lm.eye", "lm.eye(n, m, opts) -> Tensor", "An n x m (m defaults to n) matrix with ones on "
   .. "the diagonal.", { opts = OPTS, err = "n or m negative or not integers" })
E("lm.tensor", "lm.tensor(data, opts) -> Tensor", "A tensor from a number, a boolean, a nested "
   .. "array of them, or a tensor (copied). The dtype is inferred as torch.tensor does: "
   .. "int64 when every number is integral (Lua has one number type, so 2.0 counts as 2), "
   .. "float32 when any is not (NaN and inf included), bool for booleans, float32 for {}; "
   .. "opts.dtype overrides (lm.tensor({1, 2}, {dtype = lm.float32})).",
   { opts = OPTS .. "; a tensor argument keeps its dtype, device and layout "
   .. "unless opts say otherwise", fmt = "contiguous for tables; a copied tensor keeps its "
   .. "layout (preserve)", err = "ragged nested tables, non-array tables, non-numbers, more "
   .. "than 8 dims" })
E("lm.empty_strided", "lm.empty_strided(sizes, strides, opts) -> Tensor", "An uninitialised "
   .. "tensor with exactly these strides.", { opts = "{dtype, device, requires_grad}",
   fmt = "the strides given (they may describe any layout)",
   err = "sizes and strides of different lengths, negative values, opts.memory_format given" })
E("lm.randperm", "lm.randperm(n, opts) -> Tensor", "A random permutation of 1..n (1-based), "
   .. "int64 unless opts.dtype.", { err = "n negative or not an integer" })
E("lm.empty_like", "lm.empty_like(t, opts) -> Tensor", "An uninitialised tensor with t's "
   .. "sizes.", { opts = OPTS_LIKE, fmt = FMT_LIKE, err = "t not a tensor; " .. ERR_OPTS })
E("lm.zeros_like", "lm.zeros_like(t, opts) -> Tensor", "Zeros with t's sizes.",
   { opts = OPTS_LIKE, fmt = FMT_LIKE, err = "t not a tensor; " .. ERR_OPTS })
E("lm.ones_like", "lm.ones_like(t, opts) -> Tensor", "Ones with t's sizes.",
   { opts = OPTS_LIKE, fmt = FMT_LIKE, err = "t not a tensor; " .. ERR_OPTS })
E("lm.full_like", "lm.full_like(t, value, opts) -> Tensor", "value everywhere, with t's sizes.",
   { opts = OPTS_LIKE, fmt = FMT_LIKE, err = "t not a tensor, value not a number or boolean" })
E("lm.rand_like", "lm.rand_like(t, opts) -> Tensor", "Uniform [0, 1) values with t's sizes.",
   { opts = OPTS_LIKE, fmt = FMT_LIKE, err = "a non-floating dtype" })
E("lm.randn_like", "lm.randn_like(t, opts) -> Tensor", "Standard normal values with t's sizes.",
   { opts = OPTS_LIKE, fmt = FMT_LIKE, err = "a non-floating dtype" })
E("lm.randint_like", "lm.randint_like(t, low, high, opts) / lm.randint_like(t, high, opts) -> "
   .. "Tensor", "Random integers in [low, high) with t's sizes and dtype.",
   { opts = OPTS_LIKE, fmt = FMT_LIKE, err = "high <= low, non-integers" })
E("lm.manual_seed", "lm.manual_seed(n)", "Seed the global random generator (rand, randn, "
   .. "randint, randperm, dropout, init).", { err = "n not an integer in [0, 2^64)" })
E("lm.initial_seed", "lm.initial_seed() -> number", "The seed the global generator started "
   .. "from (the last manual_seed).")
E("lm.get_rng_state", "lm.get_rng_state() -> {seed, offset}", "The generator's whole state, "
   .. "for checkpoints.")
E("lm.set_rng_state", "lm.set_rng_state(state)", "Restore a state from lm.get_rng_state().",
   { err = "not {seed, offset} of non-negative integers" })

S("tensor", "The Tensor type and inspection", [[
A tensor is a Lua table with a shared metatable (`lm.tensor_mt`); its methods live in
`lm.Tensor`. `t:method(...)` is `lm.Tensor.method(t, ...)`. Operators: `+ - * / ^`, unary `-`
(tensors and numbers on either side), `..` (string concatenation with tostring).]])
E("lm.Tensor", "lm.Tensor", "The tensor method table: every `t:method` below.")
E("lm.is_tensor", "lm.is_tensor(x) -> boolean", "true when x is a lumen tensor.")
E("Tensor.requires_grad", "t.requires_grad", "A field: true when autograd records operations "
   .. "on t (set with t:requires_grad_() or opts.requires_grad).")
E("Tensor:size", "t:size() -> Size / t:size(d) -> number", "The sizes (logical order), or "
   .. "the size of dim d. A Size is a plain Lua array (#, ipairs, table.concat, indexing) that "
   .. "prints as {2, 3, 4, 4} and compares by value with ==; every function that takes sizes "
   .. "accepts one.", { err = ERR_DIM })
E("Tensor.shape", "t.shape", "A field: the sizes as a Size, the same as t:size() "
   .. "(print(x.shape) --> {2, 3, 4, 4}).")
E("Tensor:stride", "t:stride() -> array / t:stride(d) -> number", "The strides in elements "
   .. "(logical order), or the stride of dim d.",
   { fmt = "a channels-last N,C,H,W tensor has strides {H*W*C, 1, W*C, C}", err = ERR_DIM })
E("Tensor:dim", "t:dim() -> number", "The number of dims (alias t:ndimension()).")
E("Tensor:numel", "t:numel() -> number", "The number of elements (alias t:nelement()).")
E("Tensor:dtype", "t:dtype() -> dtype", "The dtype (lm.float32, ...).")
E("Tensor:device", "t:device() -> string", "The device: \"cpu\", \"cuda:N\", \"meta\" "
   .. "(sizes, strides, dtype and format only: no data) or \"sim:N\" (N = 0..3, the test device "
   .. "of kernels/sim/; \"sim\" is sim:0).")
E("Tensor:storage_offset", "t:storage_offset() -> number", "The offset of element 1 in the "
   .. "storage, in elements.")
E("Tensor:is_floating_point", "t:is_floating_point() -> boolean", "true for float32/64/16, "
   .. "bfloat16.")
E("Tensor:is_contiguous", "t:is_contiguous(fmt) -> boolean", "Whether t is contiguous in fmt "
   .. "(default lm.contiguous_format).", { fmt = "an ambiguous shape (N,C,1,1 or N,1,H,W) can "
   .. "be contiguous in both formats", err = "an unknown format" })
E("Tensor:is_non_overlapping_and_dense", "t:is_non_overlapping_and_dense() -> boolean",
   "true when t's elements fill its storage span exactly once, in some dim order.")
E("Tensor:suggest_memory_format", "t:suggest_memory_format(exact) -> format", "The format "
   .. "whose stride order t has (PyTorch's suggest_memory_format); operators pick their output "
   .. "layout from it.", { opts = "exact = false: with true, only a tensor contiguous in the "
   .. "format counts" })
E("Tensor:is_same_storage", "t:is_same_storage(u) -> boolean", "true when t and u share "
   .. "storage (one is a view of the other).")
E("Tensor:item", "t:item() -> number | boolean", "The value of a one-element tensor.",
   { err = "more or fewer than one element: `a Tensor with N elements cannot be converted to "
   .. "a scalar`" })
E("Tensor:totable", "t:totable() -> table", "The values as nested Lua arrays (logical order; "
   .. "a 0-d tensor gives a number).")
E("Tensor:free", "t:free()", "Release t's memory now instead of at the next collection; t is "
   .. "unusable afterwards (any use raises `... is a freed tensor`). Safe to call twice.",
   { note = "docs/memory.md" })

S("views", "Views", [[
Views share the tensor's storage: writing through one changes the other.]])
E("Tensor:view", "t:view(sizes) -> Tensor", "The same elements with new sizes (one size may be "
   .. "-1); no copy.", { fmt = FMT_VIEW .. "; the strides must allow it", err = "sizes whose "
   .. "product differs from numel; strides that cannot express the view (use reshape)" })
E("Tensor:reshape", "t:reshape(sizes) -> Tensor", "As view when the strides allow it, else a "
   .. "contiguous copy.", { fmt = "a copy is contiguous (a channels-last 4-D input reshaped to "
   .. "other sizes is copied)", err = "sizes whose product differs from numel" })
E("Tensor:view_as", "t:view_as(u) -> Tensor", "t:view(u:size()).", { fmt = FMT_VIEW })
E("Tensor:reshape_as", "t:reshape_as(u) -> Tensor", "t:reshape(u:size()).")
E("Tensor:permute", "t:permute(d1, d2, ...) -> Tensor", "Reorder the dims (a permutation of "
   .. "1..dim(), or one array).", { fmt = FMT_VIEW, err = "the wrong number of dims, a "
   .. "repeated dim, " .. ERR_DIM })
E("Tensor:transpose", "t:transpose(d1, d2) -> Tensor", "Swap two dims.", { fmt = FMT_VIEW,
   err = ERR_DIM })
E("Tensor:t", "t:t() -> Tensor", "Transpose of a tensor with at most 2 dims.",
   { err = "more than 2 dims" })
E("Tensor:expand", "t:expand(sizes) -> Tensor", "Broadcast size-1 dims to larger sizes "
   .. "(stride 0); -1 keeps a size.", { fmt = FMT_VIEW, err = "a non-1 dim that differs" })
E("Tensor:expand_as", "t:expand_as(u) -> Tensor", "t:expand(u:size()).")
E("Tensor:narrow", "t:narrow(d, start, length) -> Tensor", "Elements start .. start+length-1 "
   .. "(1-based; negative start counts from the end) of dim d.",
   { fmt = FMT_VIEW, err = "start 0 (it is 1-based), a range past the end, a 0-d tensor" })
E("Tensor:select", "t:select(d, i) -> Tensor", "Index i (1-based) of dim d; that dim is "
   .. "removed.", { fmt = FMT_VIEW, err = "an index out of range, a 0-d tensor" })
E("Tensor[i]", "t[i] -> Tensor or number / t[{i, {a, b}, {}, \":\"}] / t[i] = v / "
   .. "t[{...}] = v", "Torch7 indexing. t[i] is t:select(1, i) (1-based; negative counts from "
   .. "the end): a view, with the strides the memory format gives it; on a 1-D tensor it is a "
   .. "Lua number (t:select(1, i):item()). A table takes one entry per leading dim: a number "
   .. "selects (the dim goes), {a, b} is the inclusive range a..b (negative from the end), {a} "
   .. "the range a..a (the dim stays), {} or \":\" the whole dim; dims left out are whole; when "
   .. "every dim is selected by a number the result is a Lua number. t[i] = v and t[{...}] = v "
   .. "write v (a number fills, a tensor is broadcast to the slice and copied) into t.",
   { fmt = FMT_VIEW, err = "an index out of range (`lumen.index: index 5 is out of range for "
   .. "dimension 1 of size 3`), 0 (indices are 1-based), a non-integer, more entries than "
   .. "dims, a range past the end, a tensor index, a value that is neither a number nor a "
   .. "tensor, a tensor that does not broadcast to the slice", note = "#t is not the size: "
   .. "LuaJIT ignores __len on tables, so #t is always 0; use t:size(1) (the first dim) or "
   .. "t:numel() (all elements). Reading t[i] records autograd like select; t[i] = v writes in "
   .. "place (as t:select(1, i):copy_(v))." })
E("Tensor:unsqueeze", "t:unsqueeze(d) -> Tensor", "Insert a size-1 dim at d.",
   { fmt = FMT_VIEW, err = "already 8 dims" })
E("Tensor:squeeze", "t:squeeze(d) -> Tensor", "Remove dim d if its size is 1 (no d: every "
   .. "size-1 dim).", { fmt = FMT_VIEW })
E("Tensor:flatten", "t:flatten(start_dim, end_dim) -> Tensor", "Merge dims start_dim..end_dim "
   .. "(defaults 1, -1) into one; a view when the strides allow, else a copy (as reshape).",
   { fmt = "a channels-last input flattened over C, H, W is copied into a contiguous result",
   err = "start_dim after end_dim" })
E("Tensor:as_strided", "t:as_strided(sizes, strides, offset) -> Tensor", "A view with exactly "
   .. "these sizes, strides and storage offset (default t's), in elements.",
   { err = "sizes and strides of different lengths, a negative offset, a view past the "
   .. "storage" })
E("Tensor:alias", "t:alias() -> Tensor", "A new tensor object on the same data, sizes and "
   .. "strides.")

S("layout", "Layout and type changes", [[
A memory format is applied with `to` or `contiguous`; `clone` and the *_like functions preserve
the layout by default (docs/memory_formats.md).]])
E("Tensor:contiguous", "t:contiguous(fmt) -> Tensor", "t itself when already contiguous in fmt "
   .. "(default lm.contiguous_format), else a copy that is.",
   { err = "fmt = preserve_format (`preserve memory format is unsupported`), an unknown format",
   fmt = "channels_last needs 4-D, channels_last_3d 5-D" })
E("Tensor:clone", "t:clone(opts) -> Tensor", "A copy (opts: a table {memory_format =} or a "
   .. "format).", { opts = "memory_format = lm.preserve_format", fmt = FMT_LIKE })
E("Tensor:to", "t:to(x, ...) -> Tensor", "Convert: x is a dtype, a memory format, a device "
   .. "string or a table {dtype =, device =, memory_format =, copy = false}; several may be "
   .. "given. Returns t itself when nothing changes (unless copy = true).",
   { fmt = "t:to(fmt) always returns a tensor for which is_contiguous(fmt) holds and, like "
   .. "PyTorch's .to(memory_format=), tags ambiguous shapes (N,C,1,1 / N,1,H,W) with "
   .. "channels-last strides; a dtype or device change preserves the layout",
   err = "no argument, an unknown dtype/format/device, a format of the wrong rank" })
E("Tensor:type_as", "t:type_as(u) -> Tensor", "t:to(u:dtype()).")
E("Tensor:float", "t:float() -> Tensor", "t:to(lm.float32); also t:double() (float64), "
   .. "t:half() (float16), t:bfloat16(), t:long() (int64), t:int() (int32), t:byte() (uint8), "
   .. "t:bool().", { fmt = "preserved" })
E("Tensor:double", "t:double() -> Tensor", "t:to(lm.float64).")
E("Tensor:half", "t:half() -> Tensor", "t:to(lm.float16).")
E("Tensor:bfloat16", "t:bfloat16() -> Tensor", "t:to(lm.bfloat16).")
E("Tensor:long", "t:long() -> Tensor", "t:to(lm.int64).")
E("Tensor:int", "t:int() -> Tensor", "t:to(lm.int32).")
E("Tensor:byte", "t:byte() -> Tensor", "t:to(lm.uint8).")
E("Tensor:bool", "t:bool() -> Tensor", "t:to(lm.bool).")
E("Tensor:cpu", "t:cpu() -> Tensor", "t:to(\"cpu\"): t itself on the CPU, else a copy in t's "
   .. "memory format; differentiable (the gradient goes back to t's device).",
   { fmt = "preserved", err = "t is a meta tensor (no data to copy: `lumen.to: cannot copy out "
   .. "of a meta tensor`)" })
E("Tensor:cuda", "t:cuda(n) -> Tensor", "t:to(\"cuda:n\") (n from 0, default 0).",
   { fmt = "preserved", err = "n not a non-negative integer; a build without CUDA or without "
   .. "that GPU: `lumen.cuda: device cuda:0 is not available in this build ...`" })

S("math", "Math", [[
Binary ops take tensors or numbers on either side and broadcast; the result's dtype follows
PyTorch's type promotion. Every elementwise op picks its output layout by the memory-format rules
(docs/memory_formats.md). In-place forms end in `_` and return t. `lm.<op>(a, b)` is
`a:<op>(b)` (a number may come first: `lm.sub(1, t)`).

Comparisons are methods: `t:gt(2)`, `t:lt(u)`, `t:ge`, `t:le`, `t:eq`, `t:ne` give bool tensors
(as masks: `lm.where(t:gt(2), t, 0)`, `t:gt(2):sum()`). Lua's
operators cannot do it: `t > 2` raises Lua's "attempt to compare number with table" (the REPL
adds this hint to the error), `t < u` raises lumen's error, and `t == 2` is always false (Lua
compares a table with a number by identity).]])
local function binary(name, what, extra)
   E("Tensor:" .. name, "t:" .. name .. "(other" .. (extra or "") .. ") -> Tensor", what,
      { fmt = FMT_EW, err = ERR_EW })
end
binary("add", "t + alpha * other (alpha defaults to 1).", ", alpha")
binary("sub", "t - alpha * other (alpha defaults to 1).", ", alpha")
binary("mul", "t * other.")
binary("div", "t / other (true division: integer inputs give float32).")
binary("pow", "t ^ other.")
binary("maximum", "The elementwise maximum (NaN propagates).")
binary("minimum", "The elementwise minimum (NaN propagates).")
binary("fmod", "The C fmod remainder (sign of t).")
binary("atan2", "atan2(t, other), elementwise.")
binary("eq", "t == other as a bool tensor (Lua's t == 2 is always false: use t:eq(2)).")
binary("ne", "t ~= other as a bool tensor.")
binary("lt", "t < other as a bool tensor (Lua's < cannot compare tensors: it raises).")
binary("le", "t <= other as a bool tensor.")
binary("gt", "t > other as a bool tensor (Lua's t > 2 raises \"attempt to compare\": use "
   .. "t:gt(2)).")
binary("ge", "t >= other as a bool tensor.")
binary("logical_and", "Logical and (non-zero is true), bool result.")
binary("logical_or", "Logical or, bool result.")
local function inplace(name, of)
   E("Tensor:" .. name, "t:" .. name .. "(...) -> t", "In-place t:" .. of .. "(...): the result "
      .. "is written into t.", { fmt = "t keeps its layout", err = ERR_EW .. "; a result that "
      .. "does not fit t's sizes or dtype" })
end
for _, n in ipairs({ "add", "sub", "mul", "div", "pow" }) do inplace(n .. "_", n) end
local UNARY = {
   neg = "-t.", abs = "|t|.", exp = "e^t.", log = "Natural logarithm.", sqrt = "Square root.",
   rsqrt = "1 / sqrt(t).", relu = "max(t, 0).", sigmoid = "1 / (1 + e^-t).",
   tanh = "Hyperbolic tangent.", square = "t * t.", reciprocal = "1 / t.",
   sign = "-1, 0 or 1.", logical_not = "Logical not, bool result.", floor = "Round down.",
   ceil = "Round up.", round = "Round half to even (as PyTorch).", sin = "Sine.",
   cos = "Cosine.", log1p = "log(1 + t), accurate near 0.", expm1 = "e^t - 1, accurate near 0.",
   trunc = "Round toward zero (an integer t is itself).", log2 = "Base-2 logarithm.",
   log10 = "Base-10 logarithm.", exp2 = "2^t.", tan = "Tangent.", asin = "Arcsine.",
   acos = "Arccosine.", atan = "Arctangent.", sinh = "Hyperbolic sine.",
   cosh = "Hyperbolic cosine.", asinh = "Inverse hyperbolic sine.",
   acosh = "Inverse hyperbolic cosine.", atanh = "Inverse hyperbolic tangent.",
   erf = "The error function.", erfc = "1 - erf(t), accurate where erf is near 1.",
}
for _, n in ipairs({ "neg", "abs", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh",
                     "square", "reciprocal", "sign", "logical_not", "floor", "ceil", "round",
                     "sin", "cos", "log1p", "expm1", "trunc", "log2", "log10", "exp2", "tan",
                     "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf",
                     "erfc" }) do
   E("Tensor:" .. n, "t:" .. n .. "() -> Tensor", UNARY[n], { fmt = FMT_EW,
      err = "t not a tensor; a dtype the op does not take" })
   inplace(n .. "_", n)
end
E("Tensor:clamp", "t:clamp(min, max) -> Tensor", "Limit values to [min, max] (either may be "
   .. "nil; alias t:clip).", { fmt = FMT_EW, err = "min/max neither numbers nor nil" })
inplace("clamp_", "clamp")
E("Tensor:addcmul", "t:addcmul(a, b, value) -> Tensor", "t + value * a * b (value defaults to "
   .. "1).", { fmt = FMT_EW, err = ERR_EW })
inplace("addcmul_", "addcmul")
E("Tensor:addcdiv", "t:addcdiv(a, b, value) -> Tensor", "t + value * a / b (value defaults to "
   .. "1).", { fmt = FMT_EW, err = ERR_EW })
inplace("addcdiv_", "addcdiv")
E("lm.where", "lm.where(cond, a, b) -> Tensor", "a where cond is true, else b (a and b tensors "
   .. "or numbers; everything broadcasts).", { fmt = FMT_EW, err = ERR_EW })
E("Tensor:masked_fill", "t:masked_fill(mask, value) -> Tensor", "value where the bool mask "
   .. "(broadcast to t's sizes) is true, t elsewhere, as torch.masked_fill: the result has t's "
   .. "sizes, dtype and memory format; the gradient flows to t where the mask is false, and to "
   .. "a 0-dim tensor value (the sum where it is true).",
   { err = "a mask that is not bool or does not broadcast, a value that is not a number or a "
   .. "0-dim tensor" })
E("Tensor:chunk", "t:chunk(chunks, dim) -> array of Tensor", "Views of ceil(size / chunks) "
   .. "along dim (default 1), the last one smaller, as torch.chunk (fewer than chunks when the "
   .. "size runs out).", { err = "chunks not a positive integer, a dim out of range" })
E("Tensor:split", "t:split(size | {sizes}, dim) -> array of Tensor", "Views along dim (default "
   .. "1) of size each (the last smaller), or of the listed sizes, as torch.split.",
   { err = "a size that is not a positive integer, sizes that do not sum to the dim's size, a "
   .. "dim out of range" })
-- indexing: sort / argsort / topk, gather / scatter_add / index_select, cumsum, flip
-- (lua/lumen/autograd/indexing.lua over the C operators of src/ops/indexing.c)
local IDX_NOTE = "Indices are 1-based int64, as argmax's and max(dim)'s (PyTorch's are 0-based)."
local ERR_IDX = "t or index not a tensor, an index that is not int64, ranks that differ, an "
   .. "index larger than t outside dim, a dim out of range, an index value out of range "
   .. "(`lumen.gather: index 7 is out of bounds for dimension 2 with size 5`, 1-based as given)"
E("Tensor:sort", "t:sort(dim, descending) | t:sort({dim =, descending =, stable =}) -> values, "
   .. "indices", "The elements sorted along dim (default the last), ascending unless descending, "
   .. "and their 1-based int64 positions, as torch.sort with stable = true: ties keep their "
   .. "order, NaN counts as larger than every number (last ascending, first descending). Every "
   .. "dtype; differentiable (the gradient is scattered back by the indices).",
   { opts = "dim = -1, descending = false, stable = true (lumen's sort is always stable)",
     fmt = "values and indices get t's strides when t is non-overlapping and dense (a "
     .. "channels-last t gives channels-last results), else dense strides in t's dim order, as "
     .. "PyTorch's", err = "a dim out of range, an unknown option, descending not a boolean",
     note = IDX_NOTE })
E("Tensor:argsort", "t:argsort(dim, descending) -> Tensor", "The indices of t:sort(dim, "
   .. "descending) (1-based int64).", { opts = "as t:sort", fmt = "as t:sort",
   err = "as t:sort" })
E("Tensor:topk", "t:topk(k, dim, largest, sorted) | t:topk(k, {dim =, largest =, sorted =}) "
   .. "-> values, indices", "The k largest (largest "
   .. "= false: smallest) elements along dim (default the last) and their 1-based int64 "
   .. "positions, in sorted order (for sorted = false too); ties come in input order (PyTorch's "
   .. "CPU kernel orders ties by no documented rule). Differentiable.",
   { opts = "dim = -1, largest = true, sorted = true", fmt = "contiguous results, as PyTorch's",
     err = "k not an integer in 0..size, a dim out of range, largest / sorted not booleans",
     note = IDX_NOTE })
E("Tensor:gather", "t:gather(dim, index) -> Tensor", "out[i][j] = t[index[i][j]][j] (dim 1), "
   .. "as torch.gather: index is int64 (1-based) of t's rank, no larger than t outside dim; the "
   .. "result has index's sizes and t's dtype. Every dtype; differentiable (the gradient is a "
   .. "scatter_add into zeros of t's sizes).", { fmt = "the result is contiguous, as PyTorch's",
   err = ERR_IDX, note = IDX_NOTE })
E("Tensor:scatter_add", "t:scatter_add(dim, index, src) -> Tensor", "A copy of t with "
   .. "src[i][j] added at [index[i][j]][j] (dim 1), as torch.scatter_add: index int64 (1-based) "
   .. "of t's rank, no larger than src, nor than t outside dim; src of t's dtype. Additions run "
   .. "in order along dim, so results are deterministic and the same on every device. "
   .. "Differentiable: t's gradient passes through, src's is the gradient gathered at index.",
   { fmt = "the result is contiguous, as PyTorch's", err = ERR_IDX .. ", src of another dtype",
     note = IDX_NOTE })
E("Tensor:scatter_add_", "t:scatter_add_(dim, index, src) -> t", "t:scatter_add in place.",
   { fmt = "t keeps its strides", err = "as t:scatter_add; t with overlapping elements "
   .. "(expanded), a leaf that requires grad", note = IDX_NOTE })
E("Tensor:index_select", "t:index_select(dim, index) -> Tensor", "The slices of t along dim at "
   .. "the 1-based positions of the 1-D int64 index, as torch.index_select (a gather through "
   .. "the index viewed along dim, not copied). Differentiable (the gradient is an index_add).",
   { fmt = "the result is contiguous, as PyTorch's", err = ERR_IDX .. ", an index of more than "
   .. "1 dim", note = IDX_NOTE })
E("Tensor:cumsum", "t:cumsum(dim, dtype) -> Tensor", "Inclusive sums along dim, as "
   .. "torch.cumsum: integer and bool inputs sum into int64 unless dtype says otherwise; "
   .. "float32 accumulates in double, the halves in float32 (PyTorch's CPU rule). "
   .. "Differentiable (the gradient is the reverse cumsum of the gradient).",
   { fmt = "the result is contiguous, as PyTorch's", err = "a dim out of range, a bool dtype" })
E("Tensor:flip", "t:flip(dims) -> Tensor", "The elements in reverse order along each of dims (a "
   .. "dim or a list of dims), as torch.flip; index_select with reversed positions, so "
   .. "differentiable.", { fmt = "the result keeps t's memory format, as PyTorch's",
   err = "dims nil, a dim out of range or repeated" })
for _, n in ipairs({ "sort", "argsort", "topk", "gather", "scatter_add", "index_select",
                     "cumsum", "flip" }) do
   E("lm." .. n, "lm." .. n .. "(t, ...)", "Same as t:" .. n .. "(...) (see Tensor:" .. n
      .. ").")
end
E("Tensor:where", "t:where(cond, other) -> Tensor", "lm.where(cond, t, other).")
E("Tensor:fill_", "t:fill_(value) -> t", "Set every element to value.",
   { err = "value not a number (or boolean)" })
E("Tensor:zero_", "t:zero_() -> t", "Set every element to 0.")
E("Tensor:copy_", "t:copy_(src) -> t", "Copy src's values into t (src broadcasts to t's sizes; "
   .. "dtype converted).", { fmt = "t keeps its layout, whatever src's",
   err = "sizes that do not broadcast" })
E("Tensor:relu_backward", "grad:relu_backward(y) -> Tensor", "The gradient of relu given its "
   .. "output y: grad where y > 0, else 0 (used by autograd).", { fmt = FMT_EW })
E("Tensor:sigmoid_backward", "grad:sigmoid_backward(y) -> Tensor", "grad * y * (1 - y), the "
   .. "gradient of sigmoid given its output y.", { fmt = FMT_EW })
E("Tensor:tanh_backward", "grad:tanh_backward(y) -> Tensor", "grad * (1 - y^2), the gradient "
   .. "of tanh given its output y.", { fmt = FMT_EW })

S("reductions", "Reductions, comparison and linear algebra", [[
Indices are 1-based int64 (Torch7 style): `t:max(2)` on `{{1, 5, 2}}` gives `{5}, {2}`.]])
local RED_DIMS = "dims: nil (all elements), a dim, or an array of dims; keepdim = false"
E("Tensor:sum", "t:sum(dims, keepdim, dtype) -> Tensor", "Sum over dims.",
   { opts = RED_DIMS .. "; dtype: the result's dtype", fmt = FMT_RED,
   err = "a repeated dim, " .. ERR_DIM })
E("Tensor:mean", "t:mean(dims, keepdim, dtype) -> Tensor", "Mean over dims (floating dtypes).",
   { opts = RED_DIMS, fmt = FMT_RED, err = "an integer input without dtype, " .. ERR_DIM })
E("Tensor:var", "t:var(dims, unbiased | {correction = 1, keepdim = false}, keepdim) -> Tensor",
   "Variance over dims (nil: every element), divided by N - correction (unbiased = true is "
   .. "correction 1, false 0), as torch.var; N - correction <= 0 gives inf or NaN. Composed from "
   .. "mean, sub, mul and sum (lua/lumen/autograd/composed.lua), so differentiable on every "
   .. "device.", { opts = RED_DIMS, fmt = FMT_RED, err = "an integer dtype, an unknown option, "
   .. ERR_DIM })
E("Tensor:std", "t:std(dims, unbiased | {correction = 1, keepdim = false}, keepdim) -> Tensor",
   "Standard deviation, the square root of t:var; its gradient is 0 where it is 0 (PyTorch's).",
   { opts = "as t:var", fmt = FMT_RED, err = "as t:var" })
E("Tensor:prod", "t:prod(dims, keepdim, dtype) -> Tensor", "Product over dims.",
   { opts = RED_DIMS, fmt = FMT_RED, err = ERR_DIM })
E("Tensor:amax", "t:amax(dims, keepdim) -> Tensor", "Maximum over dims (values only).",
   { opts = RED_DIMS, fmt = FMT_RED, err = ERR_DIM })
E("Tensor:amin", "t:amin(dims, keepdim) -> Tensor", "Minimum over dims (values only).",
   { opts = RED_DIMS, fmt = FMT_RED, err = ERR_DIM })
E("Tensor:max", "t:max() -> Tensor / t:max(dim, keepdim) -> values, indices / t:max(other)",
   "No dim: the largest element (0-d); a dim: values and 1-based int64 indices; a tensor: the "
   .. "elementwise maximum.", { fmt = FMT_RED, err = "several dims (use amax), " .. ERR_DIM })
E("Tensor:min", "t:min() / t:min(dim, keepdim) -> values, indices / t:min(other)", "As max, for "
   .. "the smallest.", { fmt = FMT_RED, err = "several dims (use amin), " .. ERR_DIM })
E("Tensor:argmax", "t:argmax(dim, keepdim) -> Tensor", "1-based int64 index of the maximum "
   .. "along dim; no dim: the 1-based position in the flattened (row-major) tensor.",
   { err = "a table of dims, " .. ERR_DIM })
E("Tensor:argmin", "t:argmin(dim, keepdim) -> Tensor", "As argmax, for the minimum.")
E("Tensor:all", "t:all(dim, keepdim) -> Tensor", "true where every element is non-zero (no dim: "
   .. "a 0-d bool).")
E("Tensor:any", "t:any(dim, keepdim) -> Tensor", "true where some element is non-zero.")
E("Tensor:equal", "t:equal(u) -> boolean", "true when t and u have the same sizes and equal "
   .. "elements.")
E("Tensor:allclose", "t:allclose(u, rtol, atol) -> boolean", "|t - u| <= atol + rtol * |u| "
   .. "everywhere (broadcasting; rtol 1e-5, atol 1e-8).")
E("Tensor:isnan", "t:isnan() -> Tensor", "true where t is NaN (bool).", { fmt = FMT_EW })
E("Tensor:matmul", "t:matmul(u) -> Tensor", "Matrix product with PyTorch's matmul rules (1-D "
   .. "vectors, batched broadcasting); alias t:mm.", { err = "inner sizes that differ, 0-d "
   .. "inputs, different dtypes" })
E("Tensor:softmax", "t:softmax(dim, dtype) -> Tensor", "lm.F.softmax(t, dim), after a cast to "
   .. "dtype when given (torch.Tensor.softmax).", { err = "no dim, as F.softmax" })
E("Tensor:log_softmax", "t:log_softmax(dim, dtype) -> Tensor", "lm.F.log_softmax(t, dim), after "
   .. "a cast to dtype when given.", { err = "no dim, as F.log_softmax" })
E("Tensor:logsumexp", "t:logsumexp(dims, keepdim) -> Tensor", "log(sum(exp(t))) over dims (nil: "
   .. "every element), computed as max + log(sum(exp(t - max))) so it neither overflows nor "
   .. "underflows (an infinite max counts as 0, as PyTorch's); integers give float32. Gradient "
   .. "g * exp(t - result).", { opts = RED_DIMS, fmt = FMT_RED,
   err = "a repeated dim, " .. ERR_DIM })
E("Tensor:norm", "t:norm(p, dims, keepdim, dtype) -> Tensor  (or t:norm{p =, dim =, keepdim =, "
   .. "dtype =})", "The vector p-norm over dims (nil: every element), as torch.norm / "
   .. "linalg.vector_norm: p = 2 by default or \"fro\", 1, any number, math.huge / -math.huge "
   .. "(max / min of |t|), 0 (the count of non-zeros). The gradient is PyTorch's: 0 where the norm "
   .. "is 0; the infinity norm's split evenly among the elements that reach it.",
   { opts = RED_DIMS, fmt = FMT_RED, err = "p \"nuc\" (no SVD in lumen), an integer input without "
   .. "dtype, the infinity norm of an empty tensor, an unknown option, " .. ERR_DIM })
E("Tensor:isinf", "t:isinf() -> Tensor", "true where t is +inf or -inf (bool; integers: false).",
   { fmt = FMT_EW })
E("Tensor:isposinf", "t:isposinf() -> Tensor", "true where t is +inf.", { fmt = FMT_EW })
E("Tensor:isneginf", "t:isneginf() -> Tensor", "true where t is -inf.", { fmt = FMT_EW })
E("Tensor:isfinite", "t:isfinite() -> Tensor", "true where t is neither NaN nor infinite "
   .. "(integers: true).", { fmt = FMT_EW })
E("Tensor:nan_to_num", "t:nan_to_num(nan, posinf, neginf) -> Tensor  (or t:nan_to_num{nan =, "
   .. "posinf =, neginf =})", "NaN replaced by nan (0), +inf by posinf and -inf by neginf (the "
   .. "dtype's largest and lowest finite values by default). The gradient flows where t is "
   .. "finite.", { fmt = "t's sizes, dtype and memory format", err = "replacements that are not "
   .. "numbers, an unknown option" })
E("Tensor:lerp", "t:lerp(end, weight) -> Tensor", "t + weight * (end - t), weight a number or a "
   .. "tensor; for |weight| >= 0.5 computed as end - (end - t) * (1 - weight), as PyTorch (so "
   .. "lerp(t, u, 1) is u).", { fmt = FMT_EW, err = ERR_EW })
E("Tensor:clamp_min", "t:clamp_min(min) -> Tensor", "t:clamp(min, nil).", { fmt = FMT_EW })
E("Tensor:clamp_max", "t:clamp_max(max) -> Tensor", "t:clamp(nil, max).", { fmt = FMT_EW })
E("Tensor:clamp_min_", "t:clamp_min_(min) -> t", "In place t:clamp_min.")
E("Tensor:clamp_max_", "t:clamp_max_(max) -> t", "In place t:clamp_max.")
E("Tensor:remainder", "t:remainder(other) -> Tensor", "Python's modulo: the result takes other's "
   .. "sign (PyTorch's remainder; t:fmod takes t's); a number may come first "
   .. "(lm.remainder(5, t)).", { fmt = FMT_EW, err = ERR_EW })
E("Tensor:count_nonzero", "t:count_nonzero(dims) -> Tensor", "The int64 count of non-zero "
   .. "elements over dims (nil: all).", { fmt = FMT_RED })
E("Tensor:aminmax", "t:aminmax({dim =, keepdim =}) -> min, max", "amin and amax in one call "
   .. "(torch.aminmax).", { err = "an unknown option, a dim that is not a number" })
E("Tensor:var_mean", "t:var_mean(dims, unbiased | {correction =, keepdim =}, keepdim) -> var, "
   .. "mean", "t:var and t:mean over the same dims.", { opts = "as t:var" })
E("Tensor:std_mean", "t:std_mean(dims, unbiased | {correction =, keepdim =}, keepdim) -> std, "
   .. "mean", "t:std and t:mean over the same dims.", { opts = "as t:var" })
E("Tensor:trace", "t:trace() -> Tensor", "The sum of a 2-D tensor's main diagonal.",
   { err = "a tensor that is not 2-D" })
E("Tensor:roll", "t:roll(shifts, dims) -> Tensor", "Elements shifted along dims (numbers or "
   .. "lists of one length), wrapping around; without dims over the flattened tensor (sizes "
   .. "kept), as torch.roll. A copy; the gradient rolls back.", { err = "shifts and dims of "
   .. "different lengths, several shifts without dims, a dim out of range" })
E("Tensor:diagonal", "t:diagonal(offset, dim1, dim2) -> Tensor", "A view of the diagonal of dims "
   .. "dim1 and dim2 (1 and 2; offset 0, > 0 above the main one) as a new last dim "
   .. "(torch.diagonal); its gradient lands on that diagonal.", { err = "fewer than 2 dims, "
   .. "dim1 == dim2, a dim out of range" })
E("Tensor:diag", "t:diag(diagonal) -> Tensor", "A 1-D t on the diagonal-th diagonal of a square "
   .. "matrix (zeros elsewhere), or the diagonal of a 2-D t as a new 1-D tensor (torch.diag).",
   { err = "a tensor that is neither 1-D nor 2-D" })
E("Tensor:nonzero", "t:nonzero({as_tuple = false}) -> Tensor", "The n x ndim int64 1-based "
   .. "coordinates of t's non-zero elements, in row-major order (torch.nonzero); as_tuple: a "
   .. "Lua array of ndim 1-D index tensors. The count is read back from the device.",
   { err = "an options table with another key" })
E("Tensor:argwhere", "t:argwhere() -> Tensor", "t:nonzero().")
E("Tensor:masked_select", "t:masked_select(mask) -> Tensor", "The elements where the bool mask is "
   .. "true (t and mask broadcast together) as a 1-D tensor in row-major order; the gradient "
   .. "flows back to them.", { err = "a mask that is not bool or does not broadcast" })
E("Tensor:bmm", "t:bmm(mat2) -> Tensor", "Batched matrix product of two 3-D tensors, (b, n, m) "
   .. "@ (b, m, p) -> (b, n, p), without broadcasting (torch.bmm).", { err = "inputs that are "
   .. "not 3-D, batch or inner sizes that differ, different dtypes" })
E("Tensor:baddbmm", "t:baddbmm(batch1, batch2, beta, alpha) -> Tensor  (or ..., {beta =, "
   .. "alpha =})", "beta * t + alpha * batch1:bmm(batch2) (beta, alpha 1); t broadcasts to the "
   .. "product; beta = 0 ignores t's values, NaN included.", { err = "as bmm, t that does not "
   .. "broadcast, an unknown option" })
E("Tensor:addmm", "t:addmm(mat1, mat2, beta, alpha) -> Tensor  (or ..., {beta =, alpha =})",
   "beta * t + alpha * mat1 @ mat2 (2-D), t broadcast to the product (torch.addmm); beta = 0 "
   .. "ignores t's values.", { err = "inputs that are not 2-D, sizes that cannot be multiplied, "
   .. "different dtypes, t that does not broadcast" })
E("Tensor:mv", "t:mv(vec) -> Tensor", "Matrix (n, m) times vector (m) -> (n).",
   { err = "t not 2-D, vec not 1-D, sizes that differ" })
E("Tensor:dot", "t:dot(u) -> Tensor", "The 0-d sum of the products of two 1-D tensors of one "
   .. "size and dtype.", { err = "inputs that are not 1-D, sizes or dtypes that differ" })
E("Tensor:outer", "t:outer(u) -> Tensor", "Outer product of two 1-D tensors, (n) x (m) -> "
   .. "(n, m); alias t:ger.", { err = "inputs that are not 1-D" })
E("Tensor:tril", "t:tril(diagonal) -> Tensor", "The lower triangle of the last two dims (elements "
   .. "with col - row <= diagonal, default 0), zeros elsewhere; batched over the leading dims.",
   { fmt = "t's sizes, dtype and memory format", err = "fewer than 2 dims, a diagonal that is "
   .. "not an integer" })
E("Tensor:triu", "t:triu(diagonal) -> Tensor", "The upper triangle (col - row >= diagonal).",
   { fmt = "as tril", err = "as tril" })
E("Tensor:unbind", "t:unbind(dim) -> array of Tensor", "The selects along dim (default 1): "
   .. "views with that dim removed.", { err = "a 0-d tensor, a dim out of range" })
E("Tensor:movedim", "t:movedim(source, destination) -> Tensor", "A permute view that moves the "
   .. "dims of source (a dim or a list) to the places of destination, the other dims keeping "
   .. "their order (torch.movedim); alias t:moveaxis.", { err = "lists of different lengths, a "
   .. "repeated dim, a dim out of range" })
E("Tensor:swapaxes", "t:swapaxes(a, b) -> Tensor", "t:transpose(a, b); alias t:swapdims.")
E("Tensor:unflatten", "t:unflatten(dim, sizes) -> Tensor", "A view with dim split into sizes (one "
   .. "of them may be -1), torch.unflatten.", { err = "sizes that do not multiply to the dim's "
   .. "size, two -1, a view that the strides do not allow (as view)" })
E("Tensor:broadcast_to", "t:broadcast_to(sizes) -> Tensor", "t:expand(sizes).")
E("Tensor:repeat", "t[\"repeat\"](t, r1, r2, ...) or t:repeatTensor(r1, r2, ...) -> Tensor",
   "t tiled r_i times along each dim, leading dims added when there are more repeats than dims "
   .. "(torch.Tensor.repeat; `repeat` is a Lua keyword, so the method has Torch7's name "
   .. "repeatTensor too). A new contiguous tensor; the gradient sums the tiles.",
   { err = "fewer repeats than dims, a negative or non-integer repeat" })
E("Tensor:tile", "t:tile(dims) -> Tensor", "repeat, with ones put in front when dims has fewer "
   .. "entries than t has dims (torch.tile).", { err = "as repeat" })
E("Tensor:new_zeros", "t:new_zeros(sizes, opts) -> Tensor", "lm.zeros with t's dtype and device "
   .. "unless opts say otherwise (sizes a list or the leading numbers).", { opts = OPTS,
   err = ERR_OPTS })
E("Tensor:new_ones", "t:new_ones(sizes, opts) -> Tensor", "lm.ones with t's dtype and device.",
   { opts = OPTS, err = ERR_OPTS })
E("Tensor:new_empty", "t:new_empty(sizes, opts) -> Tensor", "lm.empty with t's dtype and device.",
   { opts = OPTS, err = ERR_OPTS })
E("Tensor:new_full", "t:new_full(sizes, value, opts) -> Tensor", "lm.full with t's dtype and "
   .. "device.", { opts = OPTS, err = ERR_OPTS })
E("Tensor:new_tensor", "t:new_tensor(data, opts) -> Tensor", "lm.tensor(data) (a copy) with t's "
   .. "dtype and device.", { opts = OPTS, err = ERR_OPTS })
E("Tensor:uniform_", "t:uniform_(from, to) -> t", "Fill t with values drawn uniformly from "
   .. "[from, to) (0, 1) by lumen's generator (lm.manual_seed).", { err = "an integer tensor, "
   .. "from > to, a leaf that requires grad (outside lm.no_grad)" })
E("Tensor:normal_", "t:normal_(mean, std) -> t", "Fill t with normal values (0, 1).",
   { err = "an integer tensor, std < 0, a leaf that requires grad" })
E("Tensor:bernoulli_", "t:bernoulli_(p) -> t", "Fill t with 1 with probability p (0.5), else 0.",
   { err = "p outside [0, 1], a leaf that requires grad" })
E("Tensor:random_", "t:random_(from, to) or t:random_(to) -> t", "Fill t with integers drawn "
   .. "uniformly from [from, to) ([0, to)).", { err = "no range, from >= to, a leaf that "
   .. "requires grad" })
E("lm.cat", "lm.cat(list, dim) -> Tensor", "Join tensors along dim (default 1).",
   { fmt = "the result takes the layout of the inputs (channels-last inputs give a "
   .. "channels-last result)", err = "not a non-empty array of tensors, sizes that differ "
   .. "outside dim" })
E("lm.stack", "lm.stack(list, dim) -> Tensor", "Join tensors of equal sizes along a new dim "
   .. "(default 1).", { err = "not a non-empty array, different sizes or ranks" })

S("functional_forms", "Functional forms", [[
`lm.<name>(t, ...)` calls `t:<name>(...)` looked up at call time (so autograd's wrappers apply).
For the binary ops a number may come first.]])
for _, n in ipairs({ "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt",
   "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "fmod", "atan2", "neg", "abs",
   "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh", "square", "reciprocal", "sign",
   "floor", "ceil", "round", "sin", "cos", "log1p", "expm1", "clamp", "addcmul", "addcdiv",
   "sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "matmul", "mm",
   "view", "reshape", "permute", "transpose", "expand", "narrow", "select", "unsqueeze",
   "squeeze", "flatten", "clone", "contiguous", "numel", "equal", "allclose", "isnan", "all",
   "any", "var", "std", "masked_fill", "chunk", "split",
   "softmax", "log_softmax", "logsumexp", "norm", "isinf", "isposinf", "isneginf", "isfinite",
   "nan_to_num", "lerp", "clamp_min", "clamp_max", "bmm", "baddbmm", "addmm", "mv", "dot",
   "outer", "tril", "triu", "unbind", "movedim", "moveaxis", "swapaxes", "swapdims", "unflatten",
   "broadcast_to", "tile", "remainder", "count_nonzero", "aminmax", "var_mean", "std_mean",
   "trace", "roll", "diagonal", "diag", "trunc", "log2", "log10", "exp2", "tan", "asin", "acos",
   "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "nonzero", "argwhere",
   "masked_select" }) do
   local m = n == "mm" and "matmul" or n
   if n == "moveaxis" then m = "movedim" elseif n == "swapdims" then m = "swapaxes" end
   E("lm." .. n, "lm." .. n .. "(t, ...)", "Same as t:" .. n .. "(...) (see Tensor:" .. m
      .. ").")
end

S("devices", "Devices", [[
Device strings: "cpu", "cuda:N" (a CUDA build), "meta" (PyTorch's meta device: sizes, strides,
dtype and memory format, no data; every operator gives the output it would give on the CPU) and
"sim:N" (N = 0..3; "sim" is sim:0), the test device: its memory is not the host's, and its
operators run the CPU kernels. The factories put their tensors on the default device unless
opts.device says otherwise (*_like use their source's device). Copies between devices (t:to,
t:cpu, lm.comm) keep the memory format. Reading values (item, totable, tostring) copies them to
the host; on meta they raise `lumen.item: meta tensors have no data`, and tostring prints
`tensor(..., device='meta', size=(2, 3))`. tools/run_tests.sh with LUMEN_TEST_DEVICE=sim:0 runs
the specs with sim:0 as the default device.]])
E("lm.set_default_device", "lm.set_default_device(device)", "The device the factories (lm.empty, "
   .. "zeros, ones, full, rand, randn, randint, arange, tensor, empty_strided, randperm, ...) and "
   .. "new modules' parameters use when opts.device is nil (torch.set_default_device); nil "
   .. "means \"cpu\". The environment variable LUMEN_DEFAULT_DEVICE sets it when lumen loads.",
   { err = "an unknown device: `lumen.set_default_device: unknown device 'x'`" })
E("lm.get_default_device", "lm.get_default_device() -> string", "The factories' default device "
   .. "(\"cpu\" unless lm.set_default_device or LUMEN_DEFAULT_DEVICE changed it).")
E("lm.cuda", "lm.cuda", "torch.cuda's queries and memory statistics (lua/lumen/cuda.lua; the "
   .. "backend is build/liblumen_cuda.so, loaded on first use). Without CUDA is_available() is "
   .. "false, device_count() 0, and the others raise `lumen.cuda.<fn>: CUDA is not available "
   .. "(<why>)`. A device argument is an index from 0, \"cuda\" or \"cuda:N\"; nil is the "
   .. "current device (0).")
E("lm.cuda.is_available", "lm.cuda.is_available() -> boolean", "Whether cuda:0 can be used "
   .. "(false in a build without CUDA or on a machine without a GPU).")
E("lm.cuda.device_count", "lm.cuda.device_count() -> number", "The number of usable CUDA "
   .. "devices (0 in a build without CUDA).")
E("lm.cuda.current_device", "lm.cuda.current_device() -> number", "0: every tensor names its own "
   .. "device, so there is no other current one (torch.cuda.current_device before set_device).")
E("lm.cuda.synchronize", "lm.cuda.synchronize(device)", "Wait until everything queued on the "
   .. "GPU has finished (cudaDeviceSynchronize); an error a kernel met while running shows here.",
   { err = "`lumen.cuda.synchronize: CUDA is not available (...)`, or CUDA's message" })
E("lm.cuda.memory_allocated", "lm.cuda.memory_allocated(device) -> number", "Bytes of device "
   .. "memory held by tensors (the caching allocator's live blocks, sizes rounded to 512). A "
   .. "dropped tensor gives its block back when Lua's collector finds it dead; lumen asks for a "
   .. "collection when live device bytes grow past a limit (memory_stats().collection_growth_limit"
   .. "; LUMEN_CUDA_SOFT_LIMIT sets it).")
E("lm.cuda.max_memory_allocated", "lm.cuda.max_memory_allocated(device) -> number", "The peak "
   .. "of memory_allocated since the start or reset_peak_memory_stats.")
E("lm.cuda.memory_reserved", "lm.cuda.memory_reserved(device) -> number", "Bytes the caching "
   .. "allocator holds from the GPU: live blocks and the cache (freed blocks kept for reuse).")
E("lm.cuda.memory_stats", "lm.cuda.memory_stats(device) -> table", "The allocator's counters "
   .. "under torch.cuda.memory_stats's names: allocated_bytes.all.current / .peak, "
   .. "reserved_bytes.all.current, num_device_alloc / num_device_free (cudaMalloc / cudaFree "
   .. "calls), num_alloc_retries, num_ooms, and collection_growth_limit.")
E("lm.cuda.reset_peak_memory_stats", "lm.cuda.reset_peak_memory_stats(device)", "Set the peak "
   .. "of max_memory_allocated to the bytes allocated now.")
E("lm.cuda.empty_cache", "lm.cuda.empty_cache()", "Run a collection, then give every cached "
   .. "whole segment of every GPU back to CUDA (torch.cuda.empty_cache); live tensors stay.")
E("lm.cuda.set_per_process_memory_fraction", "lm.cuda.set_per_process_memory_fraction(fraction, "
   .. "device)", "Cap the memory the allocator reserves on the device at fraction (0, 1] of it; "
   .. "beyond it an allocation releases the cache, retries, then fails as out of memory.",
   { err = "`lumen.empty: cuda:0: out of memory: tried to allocate X MiB; Y MiB live, Z MiB "
     .. "cached`" })
E("lm.cuda.get_device_name", "lm.cuda.get_device_name(device) -> string", "The GPU's name "
   .. "(\"NVIDIA H200\"; the emulated build says so).")
E("lm.cuda.get_device_properties", "lm.cuda.get_device_properties(device) -> table", "{name, "
   .. "total_memory (bytes), multi_processor_count, major, minor} of the GPU.")
E("lm.cuda.versions", "lm.cuda.versions() -> table", "{runtime, driver, cudnn, cublas, emulated}: "
   .. "the versions CUDA reports (12040 is 12.4, cuDNN 90100 is 9.1.0); emulated is true in the "
   .. "emulated build (make cuda-emu), whose numbers are 0.")
E("lm.cuda.CUDAGraph", "lm.cuda.CUDAGraph() -> graph", "An empty CUDA graph "
   .. "(torch.cuda.CUDAGraph; lua/lumen/cuda_graph.lua, kernels/cuda/graph.cu): g:capture_begin({"
   .. "pool =, device =}) and g:capture_end() record the work queued on the device between them "
   .. "(nothing captured runs), g:replay() queues it again on the tensors the capture saw, "
   .. "g:reset() drops it (its memory goes back once no tensor made in it is alive), g:pool() "
   .. "the handle of its private memory pool. docs/cuda.md, \"CUDA graphs\".",
   { err = "`lumen.cuda.CUDAGraph.replay: this graph holds no capture`; `... capture_begin: "
     .. "CUDA is not available (...)`" })
E("lm.cuda.graph", "lm.cuda.graph(g, fn [, {pool =, device =}]) -> fn's results", "Capture "
   .. "what fn queues on the device (default cuda:0) into the CUDAGraph g, as `with "
   .. "torch.cuda.graph(g):`: the device is synchronised and Lua's garbage collected first. "
   .. "Inside, nothing may wait for the GPU (item(), printing, copies from or to the host, "
   .. "tensors made from Lua values, random numbers, synchronize): that raises an error, which "
   .. "ends the capture and resets g; fn's own errors are raised again the same way. Warm up "
   .. "eagerly first; scalars such as the learning rate are captured as values.",
   { err = "`lumen.item: cuda:0: a copy to the host while a CUDA graph is being captured "
     .. "(...)`; `lumen.cuda.graph: a CUDA graph is already being captured on cuda:0 (captures "
     .. "do not nest)`" })
E("lm.cuda.graph_pool_handle", "lm.cuda.graph_pool_handle() -> number", "A new memory pool "
   .. "handle for captures that share memory (pass it as {pool =}); graphs sharing a pool are "
   .. "replayed in the order they were captured.")
E("lm.cuda.is_current_stream_capturing", "lm.cuda.is_current_stream_capturing([device]) -> "
   .. "boolean", "Whether the device's stream is being captured into a CUDA graph now (false "
   .. "without CUDA).")
E("lm.backends", "lm.backends", "torch.backends' switches for the CUDA backend: lm.backends.cudnn "
   .. "and lm.backends.cuda.matmul; and lm.backends.cpu, the CPU kernels'.")
E("lm.backends.cudnn", "lm.backends.cudnn.benchmark = true", "cuDNN's switches, settable boolean "
   .. "fields: benchmark (time every algorithm once per shape and keep the fastest; default "
   .. "false, LUMEN_CUDNN_BENCHMARK=1), allow_tf32 (convolutions in float32 may use TF32 tensor "
   .. "cores; default true, LUMEN_ALLOW_TF32=0 turns it off), deterministic (default false). "
   .. "Without CUDA the values are kept and read back, as in PyTorch.",
   { err = "`lumen.backends.cudnn.benchmark: expected a boolean`, or `no setting named 'x'`" })
E("lm.backends.cuda", "lm.backends.cuda", "Holds lm.backends.cuda.matmul.")
E("lm.backends.cuda.matmul", "lm.backends.cuda.matmul.allow_tf32 = true", "cuBLAS's switch: "
   .. "allow_tf32 (float32 matrix products may use TF32 tensor cores; default false, as in "
   .. "PyTorch; LUMEN_ALLOW_TF32=1 turns it on).")
E("lm.backends.cpu", "lm.backends.cpu.bf16_winograd = false", "The CPU kernels' switches, "
   .. "settable boolean fields. bf16_winograd (default true): bfloat16 3x3 stride-1 convolutions "
   .. "with 64 or more channels (forward, grad_input, grad_weight) may run Winograd F(4x4,3x3) "
   .. "with bfloat16 products, 1.3-1.9x faster than the direct kernels on AVX512_BF16, at about "
   .. "ten times their rounding error (relative 1.6e-2 against 1.7e-3; ResNet50 logits stay "
   .. "within 1.3x PyTorch's bf16 error). false keeps the direct kernels; "
   .. "LUMEN_CONV_BF16_WINOGRAD=0 does the same from the environment. amx (default true; "
   .. "LUMEN_AMX=0 starts it false): bfloat16 matmuls, linear layers and channels-last "
   .. "convolutions run on AMX tiles where this process has them (amx_available()); false runs "
   .. "the AVX-512 kernels, the same values within bfloat16 rounding. Where AMX is not "
   .. "available the switch reads back what was set and changes nothing. fp32_precision "
   .. "(PyTorch's torch.backends.cpu.fp32_precision; \"ieee\" by default, or \"bf16\"): "
   .. "\"bf16\" runs float32 channels-last convolutions (forward and both gradients) and "
   .. "float32 matrix products on AMX tiles from operands rounded to bfloat16, sums in float32 "
   .. "(about 2e-3 relative error, 2^-8 per operand); nothing changes where AMX is not in use.",
   { err = "`lumen.backends.cpu.bf16_winograd: expected a boolean` (amx likewise), "
   .. "`lumen.backends.cpu.fp32_precision: expected \"ieee\" or \"bf16\"`, or `no "
   .. "setting named 'x'`" })
E("lm.backends.cpu.amx_available", "lm.backends.cpu.amx_available() -> boolean", "true when this "
   .. "process can run AMX tiles: the CPU has AMX-BF16 and AMX-TILE (Intel Xeons from Sapphire "
   .. "Rapids on), the OS enables the tile state and Linux granted the permission (asked once "
   .. "per process; refused, lumen runs the AVX-512 kernels, with the same values as "
   .. "lm.backends.cpu.amx = false). The emulated build (make amx-emu) says true on any "
   .. "AVX512_BF16 CPU.")
E("lm.backends.cpu.isa", "lm.backends.cpu.isa() -> string", "The instruction-set level of the "
   .. "CPU kernels: \"amx\", \"avx512_bf16\", \"avx512\", \"avx2\" or \"c\" (the best this "
   .. "process has, or the one a test forced with lm_cpu_set_isa). lm.backends.cpu.amx = false "
   .. "leaves the level at \"amx\" and turns the tile kernels off.")
E("lm.backends.cpu.implementations", "lm.backends.cpu.implementations() -> array of "
   .. "{name=, fallback=, alias=, doc=}", "The CPU kernels' implementations, in the order their "
   .. "lists try them (src/impl.h): conv2d forward / backward in bfloat16 (amx_bf16, "
   .. "winograd_f4x4_avx512bf16, direct_avx512bf16, im2col_gemm_bf16, via_f32) and float32 "
   .. "(fp32_bf16_amx, depthwise_avx512, winograd_f4x4_avx512, pointwise_avx512, narrow_c_avx512, "
   .. "grouped_avx512, grouped_avx2, direct_rb_avx512, direct_avx512, im2col_gemm), conv3d's "
   .. "plans, the GEMM (gemm_amx_bf16, "
   .. "gemm_avx512bf16, gemm_avx512, gemm_avx2, gemm_portable), pools and batch norm. fallback: "
   .. "the family's last resort, which cannot be switched off; alias: the older environment "
   .. "variable that also switches it off when set to 0. The names are stable: LUMEN_VERBOSE's "
   .. "lines, lm.backends.cpu.disable and LUMEN_CPU_DISABLE use them (docs/performance.md, "
   .. "\"Which kernel ran\").")
E("lm.backends.cpu.disable", "lm.backends.cpu.disable(name, ...)", "Switch CPU implementations "
   .. "off by name (lm.backends.cpu.implementations()): their lists take the next entry, with "
   .. "the same semantics (values equal within the algorithms' rounding; output formats "
   .. "unchanged), so a slow or suspect kernel can be ruled out without rebuilding. "
   .. "LUMEN_CPU_DISABLE=a,b does the same at start; the older variables (LUMEN_CONV_WINOGRAD=0, "
   .. "LUMEN_CONV_PW=0, LUMEN_CONV_RB=0, LUMEN_CONV_NC=0, LUMEN_CONV_AMX=0, LUMEN_CONV_BF16=0, "
   .. "LUMEN_CONV_BF16_WINOGRAD=0, LUMEN_CONV3D_GEMM=0, LUMEN_CONV_PW_STRIDED=0, "
   .. "LUMEN_CONV_BWDW_GEMM=0) still work for this release.",
   { err = "`lumen.backends.cpu.disable: unknown implementation 'x'`, `'im2col_gemm' is its "
     .. "family's fallback and cannot be switched off`, `expected implementation names "
     .. "(strings)`, `expected one or more names`" })
E("lm.backends.cpu.enable", "lm.backends.cpu.enable(name, ...)", "Switch implementations that "
   .. "lm.backends.cpu.disable or LUMEN_CPU_DISABLE turned off on again (the older environment "
   .. "variables, read at each call, are not overridden).",
   { err = "`lumen.backends.cpu.enable: unknown implementation 'x'`" })
E("lm.backends.cpu.disabled", "lm.backends.cpu.disabled() -> array of names", "The "
   .. "implementations switched off now (by name or by their older variable), sorted.")
E("lm.backends.verbose", "lm.backends.verbose([level]) -> previous level", "LUMEN_VERBOSE from "
   .. "Lua: 1 prints one line per kernel call on stderr, "
   .. "`lumen_verbose,exec,DEVICE,OP,IMPLEMENTATION,DTYPE,FORMAT,SHAPES,MS` (OP as in LM_OP_LIST: "
   .. "conv2d, conv2d_backward, max_pool2d, batch_norm, matmul, ...; IMPLEMENTATION the names "
   .. "that ran, joined by '+', e.g. via_f32+winograd_f4x4_avx512; FORMAT and DTYPE those of the "
   .. "first tensor; SHAPES each tensor's sizes, ';' between tensors, '-' for an absent one; MS "
   .. "the kernel's time: on CUDA the stream is waited for around each call while verbose), "
   .. "conv3d adds `lumen_verbose,plan,...` lines naming its plan; 2 also prints "
   .. "`lumen_verbose,skip,DEVICE,OP,IMPLEMENTATION,REASON` for each entry a list passed over; 0 "
   .. "stops. No argument: the level now. On CUDA the name is cuDNN's algorithm "
   .. "(cudnn_fwd_implicit_precomp_gemm, ...), cublas_gemm_1x1 or lumen's own kernel.",
   { err = "`lumen.backends.verbose: expected 0, 1 or 2`" })
E("lm.comm", "lm.comm", "Moving tensors between devices in one process (torch.cuda.comm), "
   .. "loaded on first use. Device lists may name one device several times; every copy keeps "
   .. "its source's memory format (a channels-last batch scatters into channels-last chunks and "
   .. "gathers back into a channels-last batch). scatter and gather are differentiable.")
E("lm.comm.scatter", "lm.comm.scatter(t, devices, opts) -> array of tensors", "Split t along "
   .. "dim into chunks, chunk i on devices[i] (a view of t when that is t's own device, else a "
   .. "copy). Without chunk_sizes the chunks are torch.chunk's (ceil(size / #devices) each; a "
   .. "dim shorter than the device list gives fewer chunks). Differentiable.",
   { opts = "{chunk_sizes = nil, dim = 1} (dims 1-based, negative from the end)",
     fmt = "each chunk keeps t's memory format (channels-last chunks of a channels-last batch)",
     err = "`lumen.comm.scatter: <problem>`: an unknown device, an empty device list, chunk "
     .. "sizes that do not sum to the size in dim or are not one per device, a dim out of "
     .. "range, t not a tensor or 0-dim, an unknown option" })
E("lm.comm.gather", "lm.comm.gather(list, opts) -> Tensor", "Concatenate the tensors along dim "
   .. "on destination (each moved there first). Differentiable: each input's gradient goes "
   .. "back to its device.",
   { opts = "{dim = 1, destination = lm.get_default_device()}",
     fmt = "cat's rule: channels-last inputs give a channels-last result",
     err = "`lumen.comm.gather: <problem>`: an empty list, a non-tensor, sizes that differ "
     .. "outside dim, different ranks or dtypes, an unknown destination" })
E("lm.comm.broadcast", "lm.comm.broadcast(t, devices) -> array of tensors", "t on every device "
   .. "of the list: t itself where it already is (as torch), else a copy. Over GPUs (t on one "
   .. "of them, each another GPU, no grad) one NCCL broadcast; LUMEN_NCCL=0 turns that off.",
   { fmt = "copies keep t's memory format", err = "an unknown device, an empty list" })
E("lm.comm.reduce_add", "lm.comm.reduce_add(list, destination) -> Tensor", "The sum of the "
   .. "tensors, computed on destination (default: the default device). Tensors on different "
   .. "GPUs, one of them the destination, of one dtype and layout, no grad: one NCCL reduce.",
   { fmt = "the first tensor's format", err = "an empty list, sizes that differ, an unknown "
     .. "destination" })

S("distributed", "Scale-out: several processes (lm.distributed, MPI)", [[
Data-parallel training across processes and machines on Open MPI (docs/distributed.md). Start a
job with `mpirun -np K bin/lumen script.lua` (as root add `--allow-run-as-root`); every rank runs
the same script. Every collective must be called by every rank in the same order with tensors of
the same sizes and dtype: the ranks first exchange a small header, and a mismatch raises the same
`lumen.distributed.<fn>: ranks disagree: ...` error on every rank. A dense tensor
(non-overlapping and dense: contiguous, channels-last, ...) with the same strides on every rank is
communicated in place; any other is packed (contiguous) and copied back; float16 and bfloat16 are
reduced in float32. A rank that exits with an error after init aborts the whole job
(MPI_Abort), so no rank waits forever. `bin/lumen-run -np K [--max-restarts N] [--watchdog S] --
script.lua` restarts a failed job (LUMEN_RESTART_COUNT; restart_count(), heartbeat()).]])
E("lm.distributed", "lm.distributed", "Collectives across processes on MPI (Open MPI through the "
   .. "FFI), loaded on first use; libmpi.so.40 is loaded by init(), so lumen works where MPI is "
   .. "not installed. Ranks are 0-based.")
E("lm.distributed.init", "lm.distributed.init(opts)", "Join the job (MPI_Init_thread, "
   .. "MPI_THREAD_FUNNELED). Started without mpirun, a process is a job of one (rank 0).",
   { opts = "{backend = \"mpi\"} (\"nccl\" is reserved for GPUs and not available yet)",
     err = "`lumen.distributed.init: <problem>`: the MPI library cannot be loaded (install "
     .. "libopenmpi-dev openmpi-bin, or set LUMEN_MPI_LIB), an unknown backend or option, "
     .. "already initialized, finalized before (MPI starts once per process)" })
E("lm.distributed.finalize", "lm.distributed.finalize()", "Wait for the operations in flight, "
   .. "then leave the job (MPI_Finalize). bin/lumen calls it at a successful exit when the "
   .. "script did not.", { err = "not initialized" })
E("lm.distributed.is_initialized", "lm.distributed.is_initialized() -> boolean", "true between "
   .. "init() and finalize().")
E("lm.distributed.is_available", "lm.distributed.is_available() -> boolean", "Whether the MPI "
   .. "library can be loaded (needs no init).")
E("lm.distributed.library_version", "lm.distributed.library_version() -> string",
   "MPI_Get_library_version's text (needs no init).")
E("lm.distributed.rank", "lm.distributed.rank() -> number", "This process's rank, 0 .. "
   .. "world_size() - 1.", { err = "`lumen.distributed.rank: the process group is not "
   .. "initialized; call lm.distributed.init(...)` (every function of lm.distributed but "
   .. "init, is_available, is_initialized and library_version says so before init)" })
E("lm.distributed.world_size", "lm.distributed.world_size() -> number", "The number of "
   .. "processes in the job.")
E("lm.distributed.get_backend", "lm.distributed.get_backend() -> \"mpi\"", "The backend init "
   .. "chose.")
E("lm.distributed.barrier", "lm.distributed.barrier(opts) -> nil or Work", "Wait until every "
   .. "rank has reached it.", { opts = "{async = false}: true returns a Work (MPI_Ibarrier)" })
E("lm.distributed.all_reduce", "lm.distributed.all_reduce(t, opts) -> t or Work", "In place: "
   .. "every rank's t becomes the reduction of the ranks' t.",
   { opts = "{op = \"sum\" | \"mean\" | \"max\" | \"min\" | \"prod\", async = false} (bool: "
     .. "sum and max are or, min and prod and; mean needs a floating dtype)",
     fmt = "t keeps its layout; a dense t with the same strides on every rank is reduced in "
     .. "place with no copy",
     err = "`lumen.distributed.all_reduce: <problem>`: not initialized; ranks disagree (sizes, "
     .. "dtype, op, or another collective called), named with both ranks' values, on every "
     .. "rank; an unknown op or option; a meta tensor; more than 2^31-1 elements" })
E("lm.distributed.broadcast", "lm.distributed.broadcast(t, opts) -> t or Work", "In place: "
   .. "every rank's t becomes root's.", { opts = "{root = 0, async = false}",
   fmt = "as all_reduce (float16 / bfloat16 move as bits)", err = "as all_reduce; root not a "
   .. "rank, or not the same on every rank" })
E("lm.distributed.all_gather", "lm.distributed.all_gather(t, opts) -> array or Work", "A new "
   .. "array of world_size() tensors: [r + 1] is rank r's t. t is not changed.",
   { opts = "{async = false} (Work:wait() returns the array)", fmt = "t's strides when t is "
     .. "dense with the same strides on every rank, else contiguous; on t's device",
     err = "as all_reduce" })
E("lm.distributed.reduce_scatter", "lm.distributed.reduce_scatter(t, opts) -> Tensor or Work",
   "t reduced over the ranks, cut along dim 1 into world_size() equal chunks: rank r gets "
   .. "chunk r + 1 (a new tensor). t is not changed.", { opts = "{op = \"sum\", async = false}",
   fmt = "the chunk keeps t's layout when dim 1 is outermost in memory (contiguous, "
   .. "channels-last), else contiguous", err = "as all_reduce; dim 1 not a multiple of the "
   .. "world size; a 0-dim tensor" })
E("lm.distributed.Work", "h:wait() -> result; h:is_completed() -> boolean", "The handle of a "
   .. "non-blocking collective ({async = true}: MPI_Iallreduce, MPI_Ibcast, ...): wait() "
   .. "blocks until done and returns what the blocking call returns; is_completed() tests "
   .. "without blocking. The tensors must not be used before.",
   { note = "MPI advances non-blocking operations while this process is inside an MPI call: "
     .. "lm.distributed.progress() lets them move on (DistributedDataParallel's hooks call it)" })
E("lm.distributed.progress", "lm.distributed.progress()", "Test every operation in flight "
   .. "once (cheap), so that MPI advances them.")
E("lm.distributed.stats", "lm.distributed.stats", "Counters: staged (tensors that went through "
   .. "a packed or converted copy instead of in place).")
E("lm.distributed.restart_count", "lm.distributed.restart_count() -> number", "How many times "
   .. "bin/lumen-run restarted this job before the present start (LUMEN_RESTART_COUNT, as "
   .. "torchrun's restart count): 0 on the first start and outside lumen-run. A script resumes "
   .. "from its checkpoint when it is above 0 (examples/train.lua does). Needs no init.",
   { note = "docs/distributed.md, \"Surviving failures\"" })
E("lm.distributed.heartbeat", "lm.distributed.heartbeat()", "Tell lumen-run's watchdog that "
   .. "this rank makes progress: call it every step (and while a rank waits a long time for "
   .. "another). Under `lumen-run --watchdog S` a rank that calls none for S seconds (stopped, "
   .. "stuck in a collective, deadlocked) has the job ended and restarted; before its first "
   .. "heartbeat a rank has --startup-timeout seconds. Rewrites LUMEN_HEARTBEAT_DIR/rank.R (a "
   .. "few bytes); a no-op outside lumen-run. finalize() and a successful exit mark the rank "
   .. "finished. Needs no init.", { note = "docs/distributed.md, \"Surviving failures\"" })

S("threads", "Threads", "")
E("lm.set_num_threads", "lm.set_num_threads(n)", "The number of threads the kernels use.",
   { err = "n not a positive integer <= 4096" })
E("lm.get_num_threads", "lm.get_num_threads() -> number", "The number of kernel threads.")

S("autograd", "Autograd", [[
Reverse-mode differentiation on a graph recorded as operations run (lua/lumen/autograd.lua; the
rules in lua/lumen/autograd/).
A gradient has the memory format of the tensor it belongs to (a leaf's .grad has the leaf's
strides when the leaf is non-overlapping and dense). A tensor saved for backward must not be
changed in place before backward runs.]])
E("Tensor:requires_grad_", "t:requires_grad_(flag) -> t", "Start (flag true or nil) or stop "
   .. "recording operations on the leaf t.", { err = "a non-leaf tensor with flag false, a "
   .. "non-floating dtype" })
E("Tensor:backward", "t:backward(grad, opts)", "Accumulate d(t)/d(leaf) into every leaf's "
   .. ".grad (grad defaults to 1 for a one-element t).", { opts = "{retain_graph = false}: "
   .. "without it the graph's saved tensors are freed", fmt = "each .grad has its leaf's "
   .. "layout", err = "t does not require grad; no grad for a t with more than one element; a "
   .. "second backward through a freed graph" })
E("Tensor.grad", "t.grad", "A field: the accumulated gradient of a leaf (nil before "
   .. "backward); zero it with opt:zero_grad() or m:zero_grad().")
E("Tensor:detach", "t:detach() -> Tensor", "A new tensor on the same data, outside the graph.")
E("Tensor:detach_", "t:detach_() -> t", "Drop t's graph history in place.")
E("Tensor:is_leaf", "t:is_leaf() -> boolean", "true for tensors not produced by a recorded "
   .. "operation.")
E("Tensor:register_hook", "t:register_hook(fn) -> handle", "fn(grad) runs when t's gradient "
   .. "is computed; a tensor it returns replaces the gradient. handle:remove() unregisters.")
E("Tensor:register_post_accumulate_grad_hook", "t:register_post_accumulate_grad_hook(fn) -> "
   .. "handle", "On a leaf: fn(t) runs once per backward, after t.grad has received every "
   .. "gradient of that backward (PyTorch's name). DistributedDataParallel starts its "
   .. "all-reduces from it. handle:remove() unregisters.", { err = "a non-leaf t, a t that does "
   .. "not require grad, fn not a function" })
E("Tensor:retain_grad", "t:retain_grad()", "Keep the gradient of a non-leaf t in t.grad after "
   .. "backward.")
E("lm.no_grad", "lm.no_grad(fn, ...) -> ...", "Run fn(...) with recording off; returns its "
   .. "results.", { err = "fn not a function; errors of fn propagate (recording is restored)" })
E("lm.enable_grad", "lm.enable_grad(fn, ...) -> ...", "Run fn(...) with recording on (inside "
   .. "no_grad); returns its results.")
E("lm.is_grad_enabled", "lm.is_grad_enabled() -> boolean", "Whether operations are recorded.")
E("lm.set_grad_enabled", "lm.set_grad_enabled(flag)", "Turn recording on or off globally.")
E("lm.autograd", "lm.autograd", "The autograd module: lm.no_grad etc., and the helpers "
   .. "operators use to record their backward (docs/writing_operators.md).")
E("lm.autograd.no_grad", "lm.autograd.no_grad(fn, ...)", "Same as lm.no_grad.")
E("lm.autograd.queue_callback", "lm.autograd.queue_callback(fn)", "From a hook during a "
   .. "backward pass: fn() runs once the pass has finished, before backward returns, in the "
   .. "order queued, with grad mode off (PyTorch's queue_callback). An error in fn is the "
   .. "backward's error.", { err = "`lumen.autograd.queue_callback: no backward pass is "
   .. "running`; fn not a function" })
E("lm.autograd.enable_grad", "lm.autograd.enable_grad(fn, ...)", "Same as lm.enable_grad.")
E("lm.autograd.is_grad_enabled", "lm.autograd.is_grad_enabled()", "Same as "
   .. "lm.is_grad_enabled.")
E("lm.autograd.set_grad_enabled", "lm.autograd.set_grad_enabled(flag)", "Same as "
   .. "lm.set_grad_enabled.")
E("lm.autograd.record", "lm.autograd.record(out, name, backward, x1, x2, ...) -> boolean",
   "Make out the result of a recorded op when grad mode is on and an input needs grad: "
   .. "backward(grad_out) returns one gradient per input. Returns true when recorded.",
   { note = "docs/writing_operators.md walks through a complete operator." })
E("lm.autograd.recording", "lm.autograd.recording(a, b, c, d) -> boolean", "true when grad mode "
   .. "is on and one of the arguments requires grad.")
E("lm.autograd.needs", "lm.autograd.needs(x) -> boolean", "Whether x takes part in the graph "
   .. "(a tensor that requires grad).")
E("lm.autograd.edge", "lm.autograd.edge(x)", "The graph edge for input x: its grad_fn node, "
   .. "the leaf itself, or false.")
E("lm.autograd.attach", "lm.autograd.attach(out, name, backward, inputs)", "Make out the "
   .. "result of a recorded op unconditionally (record checks first).")
E("lm.autograd.fresh", "lm.autograd.fresh(t) -> t", "Mark a gradient a backward function "
   .. "allocated and hands to nobody else: a leaf may take it as its .grad without a copy.")
E("lm.autograd.meta", "lm.autograd.meta(x, out)", "x's shape and dtype when they differ from "
   .. "out's (what sum_to needs), else false.")
E("lm.autograd.sum_to", "lm.autograd.sum_to(g, m) -> Tensor", "Reduce a broadcast gradient "
   .. "back to an input's shape and dtype (m from meta; false: g as is).")
E("lm.autograd.sizes_of", "lm.autograd.sizes_of(c) -> array", "The sizes of a C tensor "
   .. "(lm_tensor*).")
E("lm.autograd.same_sizes", "lm.autograd.same_sizes(ac, bc) -> boolean", "Whether two C "
   .. "tensors have equal sizes.")
E("lm.autograd.zeros_for", "lm.autograd.zeros_for(g, sizes, fmt) -> Tensor", "Zeros with these "
   .. "sizes, g's dtype and memory format id fmt (0, contiguous, when nil).")
E("lm.autograd.where", "lm.autograd.where(cond, a, b)", "The differentiable lm.where.")
E("lm.autograd.cat", "lm.autograd.cat(list, dim)", "The differentiable lm.cat.")
E("lm.autograd.clock", "lm.autograd.clock() -> seconds", "Monotonic wall time (the profiler's "
   .. "default clock).")
E("lm.autograd.set_profiler", "lm.autograd.set_profiler(fn, clockfn) -> previous fn", "Time the "
   .. "backward nodes: fn(name, seconds) is called for each (nil turns it off); clockfn "
   .. "defaults to lm.autograd.clock.", { note = "LUMEN_PROFILE=1 installs a collecting profiler "
   .. "that prints its table to stderr at exit." })
E("lm.autograd.profile_stats", "lm.autograd.profile_stats() -> table", "The collecting "
   .. "profiler's totals: name -> {calls, seconds}.")
E("lm.autograd.profile_reset", "lm.autograd.profile_reset()", "Clear the collecting profiler's "
   .. "totals.")
E("lm.autograd.profile_collect", "lm.autograd.profile_collect(name, seconds)", "The collecting "
   .. "profiler itself (pass it to set_profiler).")
E("lm.autograd.profile_report", "lm.autograd.profile_report() -> string", "The collecting "
   .. "profiler's totals as a table, slowest first.")

S("functional", "lm.nn.functional (lm.F)", [[
`lm.F`, `lm.nn.functional` and `lm.functional` are the same table. Operators take 4-D (N,C,H,W)
input, or 3-D (C,H,W) unbatched where PyTorch does; a size option is a number or `{h, w}`.
Every operator here runs natively on channels-last input and returns channels-last output (and
gradients) for it; `lm.layout.coverage()` lists the formats each one keeps.]])
local FMT_NN = "a channels-last input gives a channels-last output and input gradient; a "
   .. "contiguous input a contiguous one"
local ERR_NN = "input not 3-D/4-D, a non-floating input, bad option values (non-positive "
   .. "kernel/stride, padding more than half the kernel, unknown option types): "
   .. "`lumen.<name>: <problem>`"
E("lm.F", "lm.F", "The functional operators (lua/lumen/functional.lua, one file per family "
   .. "in lua/lumen/functional/); also lm.nn.functional and lm.functional.")
E("lm.F.conv2d", "lm.F.conv2d(x, w, b, opts) -> Tensor", "2-D convolution (cross-correlation) "
   .. "of x (N,C,H,W) with w (out, C/groups, kH, kW) plus bias b (out) or nil.",
   { opts = "{stride = 1, padding = 0 (a number, {h, w}, \"valid\" or \"same\": an odd total "
   .. "padding, an even kernel extent, puts the extra zero on the right as PyTorch), dilation = 1, "
   .. "groups = 1, residual = nil, relu = false, act = nil}: residual (a tensor of the output's "
   .. "shape) and the activation act (\"relu\", \"relu6\", \"silu\", \"hardswish\", "
   .. "\"hardsigmoid\", \"sigmoid\", \"gelu\", \"gelu_tanh\" or \"none\"; relu = true is "
   .. "act = \"relu\") fuse act(conv + b + residual) into the kernel's epilogue (with a gradient "
   .. "wanted they run as the separate, differentiable ops)",
   fmt = FMT_NN .. "; the weight's gradient has the weight's layout",
   err = "x not 3-D/4-D, w not 4-D, dtypes that differ, channels not divisible by groups, "
   .. "padding='same' with a stride, an output with a non-positive size" })
E("lm.F.max_pool2d", "lm.F.max_pool2d(x, opts) -> Tensor [, indices]", "2-D max pooling.",
   { opts = "{kernel_size (required), stride = kernel_size, padding = 0, dilation = 1, "
   .. "ceil_mode = false, return_indices = false}; opts may also be just the kernel size; "
   .. "indices are 1-based int64 flat positions within each input plane",
   fmt = FMT_NN, err = ERR_NN })
E("lm.F.avg_pool2d", "lm.F.avg_pool2d(x, opts) -> Tensor", "2-D average pooling.",
   { opts = "{kernel_size (required), stride = kernel_size, padding = 0, ceil_mode = false, "
   .. "count_include_pad = true, divisor_override = nil}", fmt = FMT_NN, err = ERR_NN })
E("lm.F.adaptive_avg_pool2d", "lm.F.adaptive_avg_pool2d(x, size) -> Tensor", "Average pooling "
   .. "to a fixed output size (a number or {h, w}; nil/false in the pair keeps that input "
   .. "size).", { fmt = FMT_NN, err = "size missing or not non-negative integers; " .. ERR_NN })
E("lm.F.adaptive_max_pool2d", "lm.F.adaptive_max_pool2d(x, size) -> values, indices", "Max "
   .. "pooling to a fixed output size; indices are 1-based int64 positions h*W + w + 1 within "
   .. "the input plane.", { fmt = FMT_NN, err = ERR_NN })
local FMT_NN3 = "a channels_last_3d input gives a channels_last_3d output, indices and input "
   .. "gradient (for every 3-D pool; PyTorch 2.15 returns contiguous for avg_pool3d and the "
   .. "adaptive ones, with the same values); any other input contiguous ones"
local ERR_NN3 = "input not 4-D/5-D or with an empty non-batch dim, a non-floating input, bad "
   .. "option values (non-positive kernel/stride/dilation, padding more than half the kernel, an "
   .. "output with a non-positive size): `lumen.<name>: <problem>`"
E("lm.F.max_pool3d", "lm.F.max_pool3d(x, opts) -> Tensor [, indices]", "3-D max pooling of x "
   .. "(N,C,D,H,W) or unbatched (C,D,H,W).",
   { opts = "{kernel_size (required), stride = kernel_size, padding = 0, dilation = 1, "
   .. "ceil_mode = false, return_indices = false}, each size a number or {d, h, w}; opts may "
   .. "also be just the kernel size; indices are 1-based int64 flat positions (d*H + h)*W + w + 1 "
   .. "within each input volume", fmt = FMT_NN3, err = ERR_NN3 })
E("lm.F.avg_pool3d", "lm.F.avg_pool3d(x, opts) -> Tensor", "3-D average pooling.",
   { opts = "{kernel_size (required), stride = kernel_size, padding = 0, ceil_mode = false, "
   .. "count_include_pad = true, divisor_override = nil}, sizes numbers or {d, h, w}",
   fmt = FMT_NN3, err = ERR_NN3 })
E("lm.F.adaptive_avg_pool3d", "lm.F.adaptive_avg_pool3d(x, size) -> Tensor", "Average pooling "
   .. "to a fixed output size (a number or {d, h, w}; nil/false in the triple keeps that input "
   .. "size).", { fmt = FMT_NN3, err = "size missing or not non-negative integers; " .. ERR_NN3 })
E("lm.F.adaptive_max_pool3d", "lm.F.adaptive_max_pool3d(x, size, return_indices) -> values "
   .. "[, indices]", "Max pooling to a fixed output size; with return_indices, 1-based int64 "
   .. "positions (d*H + h)*W + w + 1 within the input volume.", { fmt = FMT_NN3, err = ERR_NN3 })
E("lm.F.conv3d", "lm.F.conv3d(x, w, b, opts) -> Tensor", "3-D convolution (cross-correlation) "
   .. "of x (N,C,D,H,W) or unbatched (C,D,H,W) with w (out, C/groups, kD, kH, kW) plus bias b "
   .. "(out) or nil. Runs as one lm.F.conv2d over the N*Do output depth planes with the kD depth "
   .. "taps side by side in the channels (src/ops/conv3d.c), so every dtype, device and kernel of "
   .. "conv2d applies.",
   { opts = "{stride = 1, padding = 0 (numbers or {d, h, w}; padding also \"valid\" or "
   .. "\"same\"), dilation = 1, groups = 1, residual = nil, relu = false, act = nil}: residual "
   .. "and the activation (relu, act) fuse act(conv + b + residual) into the kernel's epilogue "
   .. "as lm.F.conv2d's",
   fmt = "channels_last_3d output and gradients when x or w suggests channels_last_3d (PyTorch's "
   .. "rule; also in float64, where PyTorch's slow path returns contiguous), else contiguous",
   err = "x not 4-D/5-D, w not 5-D, dtypes that differ, channels not divisible by groups, "
   .. "padding='same' with a stride, a kernel larger than the padded input" })
local FMT_1D = "the output keeps the input's layout (contiguous N,C,L, or the N,L,C-strided "
   .. "x = y:permute(1, 3, 2) of a contiguous y), as PyTorch's does; so does the input's gradient"
local ERR_1D = "input not 2-D/3-D, a non-floating input, bad option values (non-positive "
   .. "kernel/stride, padding more than half the kernel, an output of size 0, {h, w} where {n} "
   .. "is meant): `lumen.<name>: <problem>`"
E("lm.F.conv1d", "lm.F.conv1d(x, w, b, opts) -> Tensor", "1-D convolution of x (N,C,L) or "
   .. "unbatched (C,L) with w (out, C/groups, k) plus bias b (out) or nil: lm.F.conv2d's kernels "
   .. "on the views x N,C,1,L and w out,C/groups,1,k, as PyTorch computes it.",
   { opts = "{stride = 1, padding = 0 (a number, {n}, \"valid\" or \"same\": an odd total "
   .. "padding puts the extra one on the right, as PyTorch), dilation = 1, groups = 1}",
   fmt = "an N,L,C-strided input (or weight) runs the channels-last (NHWC) kernels in place; the "
   .. "output's layout follows the weight's as PyTorch's does (N,L,C strides for an "
   .. "N,k,C-strided weight, else contiguous, whatever the input's layout); so do both "
   .. "gradients, as PyTorch's (x.grad and w.grad then take their leaf's layout)",
   err = "x not 2-D/3-D, w not 3-D, dtypes that differ, channels not divisible by groups, "
   .. "padding='same' with a stride, a kernel larger than the padded input" })
E("lm.F.max_pool1d", "lm.F.max_pool1d(x, opts) -> Tensor [, indices]", "1-D max pooling of "
   .. "x (N,C,L) or (C,L) (lm.F.max_pool2d over the view N,C,1,L).",
   { opts = "{kernel_size (required), stride = kernel_size, padding = 0, dilation = 1, "
   .. "ceil_mode = false, return_indices = false}, each size a number or {n}; opts may also be "
   .. "just the kernel size; indices are 1-based int64 positions along L",
   fmt = FMT_1D, err = ERR_1D })
E("lm.F.avg_pool1d", "lm.F.avg_pool1d(x, opts) -> Tensor", "1-D average pooling (lm.F."
   .. "avg_pool2d over the view N,C,1,L).",
   { opts = "{kernel_size (required), stride = kernel_size, padding = 0, ceil_mode = false, "
   .. "count_include_pad = true}", fmt = FMT_1D, err = ERR_1D })
E("lm.F.adaptive_avg_pool1d", "lm.F.adaptive_avg_pool1d(x, size) -> Tensor", "Average pooling "
   .. "to a fixed output length (a number or {n}).", { fmt = FMT_1D, err = "size missing or "
   .. "negative; " .. ERR_1D })
E("lm.F.adaptive_max_pool1d", "lm.F.adaptive_max_pool1d(x, size) -> values, indices", "Max "
   .. "pooling to a fixed output length; indices are 1-based int64 positions along L.",
   { fmt = FMT_1D, err = ERR_1D })
-- the normalizations' parameter dtypes (H.param_dtypes)
local NORM_PDT = " Parameters (weight, bias, running statistics) share one dtype: the input's, "
   .. "or float32 for a float16 / bfloat16 input (as PyTorch)."
E("lm.F.batch_norm", "lm.F.batch_norm(x, running_mean, running_var, weight, bias, opts) -> "
   .. "Tensor", "Batch normalisation per channel (dim 2) over the other dims of a 2-D to 5-D "
   .. "input (N,C), (N,C,L), (N,C,H,W), (N,C,D,H,W); any of the four tensors may be nil. In "
   .. "training the batch statistics are used and the running ones updated in place."
   .. NORM_PDT,
   { opts = "{training = false, momentum = 0.1, eps = 1e-5, residual = nil, relu = false}: "
   .. "residual and relu fuse relu(bn(x) + residual) into the same pass; PyTorch's positional "
   .. "form (x, running_mean, running_var, weight, bias, training, momentum, eps) also works",
   fmt = FMT_NN .. "; a channels_last_3d input a channels_last_3d output and gradient; an "
   .. "N,L,C-strided 3-D input a contiguous output and an N,L,C-strided input gradient (as "
   .. "PyTorch)", err = "x with fewer than 2 dims, per-channel tensors of the wrong size, training "
   .. "with one value per channel, eval without running statistics" })
E("lm.F.group_norm", "lm.F.group_norm(x, num_groups, weight, bias, opts) -> Tensor", "Group "
   .. "normalisation: each sample's channels split into num_groups groups, each normalised over "
   .. "its channels and spatial dims (biased variance), then weight * . + bias per channel "
   .. "(either may be nil). A native kernel: in channels-last a group is a contiguous run of "
   .. "each pixel." .. NORM_PDT, { opts = "{eps = 1e-5}, or eps as "
   .. "PyTorch's fifth argument", fmt = "output and input gradient in the input's "
   .. "memory format (contiguous, channels_last, channels_last_3d); float16 / bfloat16 computed "
   .. "in float32", err = "x with fewer than 2 dims, channels not divisible by num_groups, "
   .. "weight / bias not of C elements, a non-floating input" })
E("lm.F.layer_norm", "lm.F.layer_norm(x, normalized_shape, weight, bias, opts) -> Tensor",
   "Layer normalisation over the trailing dims normalized_shape (a number or a list); weight "
   .. "and bias (nil or of normalized_shape) applied elementwise. Runs the group_norm kernel on "
   .. "the (M, D) view of x: ConvNeXt's LayerNorm2d (x:permute(1, 3, 4, 2) of a channels-last "
   .. "x, layer_norm over C, permute back) costs no copy and stays channels-last."
   .. NORM_PDT,
   { opts = "{eps = 1e-5}, or eps as PyTorch's fifth argument",
     fmt = "the view's layout; a channels-last input normalised over other dims gives a "
   .. "channels-last output", err = "normalized_shape not the input's "
   .. "trailing sizes, weight / bias of another shape" })
E("lm.F.instance_norm", "lm.F.instance_norm(x, running_mean, running_var, weight, bias, opts) "
   .. "-> Tensor", "Instance normalisation: each (sample, channel) over its spatial dims "
   .. "(group_norm with one group per channel). With use_input_stats and running statistics, "
   .. "they are updated in place as PyTorch does (the batch mean of the per-instance mean and "
   .. "unbiased variance); use_input_stats = false normalises with them." .. NORM_PDT,
   { opts = "{use_input_stats = true, momentum = 0.1, eps = 1e-5}, or PyTorch's positional "
   .. "use_input_stats, momentum, eps", fmt = "output and input "
   .. "gradient in the input's memory format (PyTorch 2.x returns contiguous for channels-last "
   .. "input)", err = "x with fewer than 3 dims, one spatial element, only one running "
   .. "statistic, use_input_stats = false without them" })
E("lm.F.relu", "lm.F.relu(x, inplace) -> Tensor", "max(x, 0); in place when inplace is true.",
   { fmt = FMT_EW })
E("lm.F.relu_", "lm.F.relu_(x) -> x", "In-place relu.")
E("lm.F.sigmoid", "lm.F.sigmoid(x) -> Tensor", "x:sigmoid().")
E("lm.F.tanh", "lm.F.tanh(x) -> Tensor", "x:tanh().")
E("lm.F.linear", "lm.F.linear(x, w, b[, opts]) -> Tensor", "x @ w^T + b: x (..., in), w (out, "
   .. "in), b (out) or nil. opts.act (a lumen extension, as F.conv2d's): relu, relu6, silu, "
   .. "hardswish, hardsigmoid, sigmoid, gelu or gelu_tanh applied to the result; with gradients "
   .. "off it runs in the GEMM's epilogue (float32 on the CPU: with the bias, on each tile as it "
   .. "is finished, no pass over the output), with gradients on as the activation op. "
   .. "nn.Sequential(Linear, activation) in evaluation with gradients off passes its activation "
   .. "this way (ConvNeXt's Linear -> GELU).",
   { err = "in sizes that differ, w not 2-D, dtypes that differ, an unknown act or option" })
E("lm.F.dropout", "lm.F.dropout(x, p, training) -> Tensor", "Zero elements with probability p "
   .. "(default 0.5) and scale the rest by 1/(1-p); the identity when training is false "
   .. "(default true).", { fmt = FMT_EW, err = "p outside [0, 1]" })
E("lm.F.flatten", "lm.F.flatten(x, start_dim, end_dim) -> Tensor", "x:flatten(start_dim, "
   .. "end_dim) (defaults 1, -1).", { fmt = "a reshape: a channels-last input is copied into a "
   .. "contiguous result (as PyTorch)" })
E("lm.F.cat", "lm.F.cat(list, dim) -> Tensor", "lm.cat.")
E("lm.F.softmax", "lm.F.softmax(x, dim) -> Tensor", "exp(x) / sum(exp(x)) along dim.",
   { fmt = FMT_EW, err = "dim missing or out of range, a non-floating input" })
E("lm.F.log_softmax", "lm.F.log_softmax(x, dim) -> Tensor", "log(softmax(x, dim)), computed "
   .. "stably.", { fmt = FMT_EW, err = "dim missing or out of range" })
E("lm.F.nll_loss", "lm.F.nll_loss(log_probs, target, opts) -> Tensor", "Negative log "
   .. "likelihood: target holds 1-based int64 class indices (like argmax's).",
   { opts = "{weight = nil (per-class weights), ignore_index = -100, reduction = \"mean\" | "
   .. "\"sum\" | \"none\"}", err = "target not int64, a class index out of range, sizes that "
   .. "do not match" })
E("lm.F.cross_entropy", "lm.F.cross_entropy(logits, target, opts) -> Tensor", "nll_loss("
   .. "log_softmax(logits, class dim), target, opts): the classification loss (mean by "
   .. "default). target: 1-based int64 class indices, or a floating tensor of the logits' "
   .. "sizes holding class probabilities (soft labels: -sum of weight * target * log_softmax "
   .. "over the classes, the mean over the samples). label_smoothing = e (PyTorch's): class "
   .. "targets give (1 - e) * nll + e / C * the mean of -sum(weight * log_softmax) over the "
   .. "kept targets; probability targets become target * (1 - e) + e / C.",
   { opts = "as nll_loss, and label_smoothing = 0 (between 0 and 1)", err = "label_smoothing "
   .. "outside [0, 1], ignore_index with probability targets, a floating target of other "
   .. "sizes, a weight that is not one value a class, an unknown option" })
E("lm.F.mse_loss", "lm.F.mse_loss(a, b, opts) -> Tensor", "Mean squared error.",
   { opts = "{reduction = \"mean\" | \"sum\" | \"none\"}", err = "sizes that do not broadcast" })
local RED = "reduction = \"mean\" | \"sum\" | \"none\""
E("lm.F.l1_loss", "lm.F.l1_loss(input, target, opts) -> Tensor", "Mean absolute error "
   .. "|input - target| (composed: every device, dtype and layout; the element losses keep the "
   .. "input's memory format).", { opts = "{" .. RED .. "}", err = "sizes that do not "
   .. "broadcast, non-float inputs, an unknown option or reduction" })
E("lm.F.smooth_l1_loss", "lm.F.smooth_l1_loss(input, target, opts) -> Tensor", "With z = "
   .. "|input - target|: 0.5 z^2 / beta where z < beta, else z - 0.5 beta (beta = 0: l1_loss).",
   { opts = "{" .. RED .. ", beta = 1}", err = "as l1_loss, beta < 0" })
E("lm.F.huber_loss", "lm.F.huber_loss(input, target, opts) -> Tensor", "0.5 z^2 where z < delta, "
   .. "else delta (z - 0.5 delta).", { opts = "{" .. RED .. ", delta = 1}",
   err = "as l1_loss, delta <= 0" })
E("lm.F.binary_cross_entropy", "lm.F.binary_cross_entropy(input, target, opts) -> Tensor",
   "-w (y log x + (1 - y) log(1 - x)) for probabilities x in [0, 1], each log clamped at -100 as "
   .. "PyTorch's; its backward is PyTorch's ((x - y) / max(x (1 - x), 1e-12)).",
   { opts = "{weight = (broadcasts to input), " .. RED .. "}", err = "input outside [0, 1] "
   .. "(NaN included), inside lm.autocast (unsafe, as in PyTorch: use the _with_logits form), "
   .. "a weight that does not broadcast, as l1_loss" })
E("lm.F.binary_cross_entropy_with_logits", "lm.F.binary_cross_entropy_with_logits(input, target, "
   .. "opts) -> Tensor", "PyTorch's stable form on logits: (1 - y) x - lw logsigmoid(x), lw = "
   .. "(pos_weight - 1) y + 1, times weight; differentiable in every tensor argument.",
   { opts = "{weight =, " .. RED .. ", pos_weight = (broadcasts along the last dim)}",
   err = "as binary_cross_entropy (autocast allowed)" })
E("lm.F.kl_div", "lm.F.kl_div(input, target, opts) -> Tensor", "KL divergence with input as "
   .. "log-probabilities: target (log target - input), 0 where target is 0; log_target = true "
   .. "takes target as log-probabilities. reduction \"batchmean\" divides the sum by the batch "
   .. "size (the true KL divergence); \"mean\" (the default, as PyTorch's) by every element.",
   { opts = "{reduction = \"mean\" | \"batchmean\" | \"sum\" | \"none\", log_target = false}",
   err = "as l1_loss" })
E("lm.F.logsigmoid", "lm.F.logsigmoid(x) -> Tensor", "log(sigmoid(x)) = min(x, 0) - log1p(exp(-"
   .. "|x|)), finite for any x; gradient sigmoid(-x).", { fmt = FMT_EW })
E("lm.F.softsign", "lm.F.softsign(x) -> Tensor", "x / (1 + |x|).", { fmt = FMT_EW })
E("lm.F.tanhshrink", "lm.F.tanhshrink(x) -> Tensor", "x - tanh(x).", { fmt = FMT_EW })
E("lm.F.softshrink", "lm.F.softshrink(x, lambd) -> Tensor  (or (x, {lambd =}))", "x - lambd "
   .. "above lambd (0.5), x + lambd below -lambd, 0 between; NaN stays NaN.",
   { fmt = FMT_EW, err = "lambd < 0 or not a number" })
E("lm.F.hardshrink", "lm.F.hardshrink(x, lambd) -> Tensor  (or (x, {lambd =}))", "0 in "
   .. "[-lambd, lambd] (0.5), x elsewhere; no gradient to a NaN, as PyTorch.", { fmt = FMT_EW })
E("lm.F.threshold", "lm.F.threshold(x, threshold, value, inplace) -> Tensor  (or (x, "
   .. "{threshold =, value =, inplace =}))", "value where x <= threshold, else x.",
   { fmt = FMT_EW, err = "threshold or value not numbers" })
E("lm.F.glu", "lm.F.glu(x, dim) -> Tensor", "a * sigmoid(b), a and b the halves of x along dim "
   .. "(default -1).", { err = "an odd size along dim, a 0-d input" })
E("lm.F.prelu", "lm.F.prelu(x, weight) -> Tensor", "x where x > 0, weight * x elsewhere; weight "
   .. "has one element or one per channel (dim 2).", { fmt = FMT_EW, err = "a weight whose size "
   .. "is neither 1 nor the channel count, a dtype other than x's" })
E("lm.F.softmin", "lm.F.softmin(x, dim) -> Tensor", "softmax(-x, dim).")
E("lm.F.normalize", "lm.F.normalize(x, opts) -> Tensor", "x / max(||x||_p over dim, eps) "
   .. "(Tensor:norm's gradient).", { opts = "{p = 2, dim = 2 (1 for a 1-D x), eps = 1e-12}",
   fmt = FMT_EW, err = "an integer input, a dim out of range, an unknown option" })
E("lm.F.cosine_similarity", "lm.F.cosine_similarity(x1, x2, opts) -> Tensor", "The cosine of the "
   .. "angle between x1 and x2 along dim (x1, x2 broadcast): each divided by its norm clamped at "
   .. "eps, then summed, as PyTorch (the result stays in [-1, 1]).", { opts = "{dim = 2, eps = "
   .. "1e-8}", err = "sizes that do not broadcast, integer inputs" })
E("lm.F.pairwise_distance", "lm.F.pairwise_distance(x1, x2, opts) -> Tensor", "||x1 - x2 + eps||_p "
   .. "over the last dim.", { opts = "{p = 2, eps = 1e-6, keepdim = false}", err = "as "
   .. "cosine_similarity" })
E("lm.F.embedding", "lm.F.embedding(input, weight, padding_idx) -> Tensor  (or (input, weight, "
   .. "{padding_idx =}))", "The rows of weight (num_embeddings x dim) at input's 1-based int64 "
   .. "indices: input's sizes with dim appended; the rows looked up at padding_idx (1-based, "
   .. "negative from the end) pass no gradient, as PyTorch's.", { err = "indices out of range "
   .. "or not int64 / int32, a weight that is not 2-D, padding_idx outside num_embeddings, "
   .. "max_norm / scale_grad_by_freq / sparse (not supported)" })
E("lm.F.one_hot", "lm.F.one_hot(t, num_classes) -> Tensor", "int64 with a new last dim of "
   .. "num_classes (default: t's largest class), 1 at each of t's 1-based classes (lumen's "
   .. "class convention, as cross_entropy's targets), 0 elsewhere.", { err = "a dtype other than "
   .. "int64, a class below 1 or above num_classes, an empty t without num_classes" })

E("lm.nn.MaxPool3d", "lm.nn.MaxPool3d(opts) / lm.nn.MaxPool3d(kernel_size, stride, padding, "
   .. "dilation, return_indices, ceil_mode)", "lm.F.max_pool3d as a module.",
   { opts = "as lm.F.max_pool3d" })
E("lm.nn.AvgPool3d", "lm.nn.AvgPool3d(opts) / lm.nn.AvgPool3d(kernel_size, stride, padding, "
   .. "ceil_mode, count_include_pad, divisor_override)", "lm.F.avg_pool3d as a module.",
   { opts = "as lm.F.avg_pool3d" })
E("lm.nn.AdaptiveAvgPool3d", "lm.nn.AdaptiveAvgPool3d(size)", "lm.F.adaptive_avg_pool3d as a "
   .. "module.")
E("lm.nn.AdaptiveMaxPool3d", "lm.nn.AdaptiveMaxPool3d(size, return_indices)", "lm.F."
   .. "adaptive_max_pool3d as a module (values only unless return_indices).")
-- issue 40 (wt-act): activations, pad, shuffles, feature dropout ----------------------------
local FMT_ACT = "elementwise: the output and the input gradient follow the input's memory format "
   .. "(contiguous, channels_last, channels_last_3d)"
local ERR_ACT = "a non-tensor or non-floating input, an unknown option, inplace not a boolean"
E("lm.F.silu", "lm.F.silu(x, inplace) -> Tensor", "x * sigmoid(x) (PyTorch's SiLU / swish); in "
   .. "place when inplace is true (or {inplace = true}). One native elementwise pass (LM_SILU), "
   .. "float32/float64/bfloat16/float16, every device.", { fmt = FMT_ACT, err = ERR_ACT })
E("lm.F.gelu", "lm.F.gelu(x, approximate) -> Tensor", "x * Phi(x) with the exact erf form "
   .. "(approximate = \"none\", the default) or the tanh form (\"tanh\"); approximate may be "
   .. "given as {approximate = }.", { opts = "{approximate = \"none\" | \"tanh\"}",
   fmt = FMT_ACT, err = ERR_ACT .. ", approximate not \"none\" or \"tanh\"" })
E("lm.F.hardswish", "lm.F.hardswish(x, inplace) -> Tensor", "x * relu6(x + 3) / 6 (MobileNetV3).",
   { fmt = FMT_ACT, err = ERR_ACT })
E("lm.F.hardsigmoid", "lm.F.hardsigmoid(x, inplace) -> Tensor", "relu6(x + 3) / 6 "
   .. "(MobileNetV3's squeeze-and-excitation gate).", { fmt = FMT_ACT, err = ERR_ACT })
E("lm.F.relu6", "lm.F.relu6(x, inplace) -> Tensor", "min(max(x, 0), 6), PyTorch's hardtanh(x, "
   .. "0, 6): no gradient at 0 and 6.", { fmt = FMT_ACT, err = ERR_ACT })
E("lm.F.leaky_relu", "lm.F.leaky_relu(x, negative_slope, inplace) -> Tensor", "x > 0 ? x : "
   .. "negative_slope * x (negative_slope defaults to 0.01); or leaky_relu(x, {negative_slope =, "
   .. "inplace =}).", { opts = "{negative_slope = 0.01, inplace = false}", fmt = FMT_ACT,
   err = ERR_ACT .. ", negative_slope not a number" })
E("lm.F.leaky_relu_", "lm.F.leaky_relu_(x, negative_slope) -> x", "In-place leaky_relu.")
E("lm.F.elu", "lm.F.elu(x, alpha, inplace) -> Tensor", "x > 0 ? x : alpha * (exp(x) - 1) (alpha "
   .. "defaults to 1); or elu(x, {alpha =, inplace =}).", { opts = "{alpha = 1, inplace = false}",
   fmt = FMT_ACT, err = ERR_ACT .. ", alpha not a number" })
E("lm.F.elu_", "lm.F.elu_(x, alpha) -> x", "In-place elu.")
E("lm.F.hardtanh", "lm.F.hardtanh(x, min_val, max_val, inplace) -> Tensor", "min(max(x, "
   .. "min_val), max_val) (defaults -1 and 1; or hardtanh(x, {min_val =, max_val =, inplace =})); "
   .. "no gradient at and beyond the bounds, as PyTorch's hardtanh_backward (a NaN passes its "
   .. "gradient).",
   { opts = "{min_val = -1, max_val = 1, inplace = false}", fmt = FMT_ACT,
   err = ERR_ACT .. ", min_val greater than max_val" })
E("lm.F.hardtanh_", "lm.F.hardtanh_(x, min_val, max_val) -> x", "In-place hardtanh.")
E("lm.F.softplus", "lm.F.softplus(x, beta, threshold) -> Tensor", "log(1 + exp(beta * x)) / "
   .. "beta, and x itself where beta * x > threshold (defaults 1 and 20; or softplus(x, {beta =, "
   .. "threshold =})); gradient sigmoid(beta * x), 1 above the threshold.",
   { opts = "{beta = 1, threshold = 20}", fmt = FMT_ACT,
   err = ERR_ACT .. ", beta or threshold not a number" })
E("lm.F.selu", "lm.F.selu(x, inplace) -> Tensor", "scale * elu(x, alpha) with PyTorch's "
   .. "constants (alpha 1.6732632423543772, scale 1.0507009873554805).",
   { fmt = FMT_ACT, err = ERR_ACT })
E("lm.F.celu", "lm.F.celu(x, alpha, inplace) -> Tensor", "x > 0 ? x : alpha * (exp(x / alpha) - "
   .. "1) (alpha defaults to 1; or celu(x, {alpha =, inplace =})).",
   { opts = "{alpha = 1, inplace = false}", fmt = FMT_ACT, err = ERR_ACT .. ", alpha 0" })
E("lm.F.celu_", "lm.F.celu_(x, alpha) -> x", "In-place celu.")
E("lm.F.mish", "lm.F.mish(x, inplace) -> Tensor", "x * tanh(softplus(x)).",
   { fmt = FMT_ACT, err = ERR_ACT })
E("lm.F.pad", "lm.F.pad(x, pad, opts) -> Tensor", "Pads the last #pad/2 dims of x: pad is "
   .. "PyTorch's flat list, last dim first ({left, right, top, bottom, front, back}). Modes: "
   .. "\"constant\" (value; negative pads crop; any number of dims), \"reflect\", "
   .. "\"replicate\", \"circular\" (1 to 3 dims of a batched or unbatched input). Also "
   .. "pad(x, pad, mode, value). Differentiable.",
   { opts = "{mode = \"constant\", value = 0}", fmt = "the result and the input gradient keep "
   .. "the input's memory format in every mode (channels_last, channels_last_3d; PyTorch "
   .. "drops it for some modes)", err = "pad of odd length or longer than 2 * x:dim(), "
   .. "non-integers, an unknown mode or option, value with a non-constant mode, reflect pads "
   .. "not less than the size, circular pads larger than the size, negative non-constant pads, "
   .. "a non-constant mode on an input of the wrong rank" })
E("lm.F.pixel_shuffle", "lm.F.pixel_shuffle(x, upscale_factor) -> Tensor", "(*, C r^2, H, W) -> "
   .. "(*, C, H r, W r). Differentiable.", { fmt = "one copy into the input's memory format "
   .. "(a channels-last input gives a channels-last output and gradient)", err = "fewer than 3 "
   .. "dims, C not divisible by r^2, r not a positive integer" })
E("lm.F.pixel_unshuffle", "lm.F.pixel_unshuffle(x, downscale_factor) -> Tensor", "(*, C, H r, "
   .. "W r) -> (*, C r^2, H, W), the inverse of pixel_shuffle.", { fmt = "as lm.F.pixel_shuffle",
   err = "fewer than 3 dims, H or W not divisible by r, r not a positive integer" })
E("lm.F.channel_shuffle", "lm.F.channel_shuffle(x, groups) -> Tensor", "(N, C, *) with C = g k: "
   .. "the channels reordered from (g, k) to (k, g) (ShuffleNet).", { fmt = "one copy into the "
   .. "input's memory format (PyTorch drops channels-last here; lumen keeps it)",
   err = "fewer than 3 dims, C not divisible by groups" })
E("lm.F.dropout1d", "lm.F.dropout1d(x, p, training, inplace) -> Tensor", "dropout2d's channel "
   .. "dropout for (N, C, L) input, or an unbatched (C, L) one (one draw per channel).",
   { fmt = FMT_EW,
     err = "p outside [0, 1], a wrong rank, a non-floating input, an unknown option" })
E("lm.F.dropout2d", "lm.F.dropout2d(x, p, training, inplace) -> Tensor", "Zeroes whole channels "
   .. "(one draw per sample and channel) with probability p (default 0.5) and scales the rest by "
   .. "1/(1-p); the identity when training is false. 3-D (N, C, L) or 4-D input; also "
   .. "dropout2d(x, {p =, training =, inplace =}).", { fmt = FMT_EW,
   err = "p outside [0, 1], a wrong rank, a non-floating input, an unknown option" })
E("lm.F.dropout3d", "lm.F.dropout3d(x, p, training, inplace) -> Tensor", "As dropout2d for 5-D "
   .. "input (or 4-D unbatched C, D, H, W: one draw per channel).", { fmt = FMT_EW,
   err = "p outside [0, 1], a wrong rank, a non-floating input, an unknown option" })
-- end of issue 40 (wt-act) -------------------------------------------------------------------
-- issue 40 (wt-resample): interpolate, transposed convolutions -------------------------------
E("lm.F.interpolate", "lm.F.interpolate(x, opts) -> Tensor", "Also PyTorch's positional form "
   .. "interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor, "
   .. "antialias), size a number or a list ({9, 9}). Resamples the spatial dims of a "
   .. "3-D (N, C, L), 4-D or 5-D input to opts.size or by opts.scale_factor (numbers or one per "
   .. "spatial dim; output size floor(in * scale)). Modes \"nearest\" (src = floor(dst * scale)), "
   .. "\"nearest-exact\" (floor((dst + 0.5) * scale)), \"area\" (an adaptive average pooling "
   .. "to the output size, as PyTorch's), \"linear\" (3-D), \"bilinear\" (4-D), "
   .. "\"bicubic\" (4-D; A = -0.75, taps clamped to the border), \"trilinear\" (5-D); "
   .. "align_corners for the interpolating modes (default false); without "
   .. "recompute_scale_factor a given scale_factor is the one the indices use (PyTorch's), with "
   .. "recompute_scale_factor = true the scale is in / out. Indices and weights are PyTorch's "
   .. "CPU ones, taken in its order; the op runs one pass per resized dim (lm_resample: each "
   .. "output position the weighted sum of its few taps, on every device), float16 / bfloat16 "
   .. "computed in float32 and rounded once. Differentiable (the transposed taps). Nearest modes "
   .. "copy values (NaN and infinities too, as PyTorch), and take uint8 input (images, masks) "
   .. "as PyTorch does. antialias = true "
   .. "(bilinear and bicubic, 4-D input only: PyTorch's _upsample_bilinear2d_aa / "
   .. "_upsample_bicubic2d_aa) low-pass filters when downsampling as PIL does: the triangle or "
   .. "the cubic (A = -0.5) filter, stretched by the scale when it is above 1, centred at "
   .. "scale * (dst + 0.5) (align_corners only changes the scale to (in - 1) / (out - 1)), cut "
   .. "to the input and normalized per output pixel; a dim that keeps its size is left as it is. "
   .. "Upsampling bilinear with it is plain bilinear. A dim that keeps its size under a "
   .. "scale_factor other than 1 (3 * 1.25 floors to 3) is left as it is by nearest in 2-D, the "
   .. "linear modes and antialias, and resampled with the scale by nearest in 1-D and 3-D, "
   .. "nearest-exact and bicubic, as PyTorch 2.x's kernels do. There PyTorch's CPU backward "
   .. "of nearest 1-D / 3-D and of antialias is not its forward's (its gradcheck fails); "
   .. "lumen's gradient is the forward's. PyTorch's antialiased kernels also give every row the "
   .. "first one's value where the output is one column wide; lumen resamples it. "
   .. "float16 / bfloat16 are computed in float32 (PyTorch's CPU kernel refuses them).",
   { opts = "{size =, scale_factor =, mode = \"nearest\", align_corners =, "
   .. "recompute_scale_factor =, antialias = false}", fmt = "the output and the input "
   .. "gradient keep the input's memory format (channels_last, channels_last_3d), computed in "
   .. "that physical order without a permuting copy", err = "neither or both of size and "
   .. "scale_factor, an unknown mode, a mode of another rank (linear needs 3-D, bilinear / "
   .. "bicubic 4-D, trilinear 5-D), sizes or scales that are not positive or of the wrong "
   .. "count, align_corners with a nearest mode, an integer input, antialias with a mode "
   .. "other than bilinear / bicubic or an input that is not 4-D (PyTorch's message), a "
   .. "non-boolean antialias, an unknown option" })
E("lm.F.upsample", "lm.F.upsample(x, size, scale_factor, mode, align_corners) -> Tensor",
   "The deprecated spelling of lm.F.interpolate.")
local FMT_CONVT = "channels-last (channels_last / channels_last_3d) when x or w suggests it, else "
   .. "contiguous; the input gradient likewise (PyTorch's conv_transpose3d drops "
   .. "channels_last_3d; lumen keeps it); a leaf weight's .grad takes the leaf's layout"
local ERR_CONVT = "a wrong rank of input or weight, weight dim 1 not the input's channels, "
   .. "channels not divisible by groups, a bias not of size C_out, mixed dtypes, output_padding "
   .. "not smaller than stride or dilation, a non-positive output size, an unknown option"
E("lm.F.conv_transpose2d", "lm.F.conv_transpose2d(x, w, b, opts) -> Tensor", "The transposed "
   .. "convolution (the gradient of conv2d with respect to its input): x (N, C_in, H, W) or "
   .. "unbatched (C_in, H, W), w (C_in, C_out / groups, kH, kW) (PyTorch's layout), b nil or "
   .. "(C_out); H_out = (H - 1) stride - 2 padding + dilation (kH - 1) + output_padding + 1. "
   .. "Runs on the convolution kernels: the forward is lm_conv2d_backward's input gradient, "
   .. "grad_input the convolution forward, grad_weight the convolution's weight gradient. "
   .. "float32, float64, float16, bfloat16. Differentiable.",
   { opts = "{stride = 1, padding = 0, output_padding = 0, groups = 1, dilation = 1} (numbers or "
   .. "{h, w})", fmt = FMT_CONVT, err = ERR_CONVT })
E("lm.F.conv_transpose1d", "lm.F.conv_transpose1d(x, w, b, opts) -> Tensor", "As "
   .. "conv_transpose2d for x (N, C_in, L) or (C_in, L), w (C_in, C_out / groups, k): the 2-D "
   .. "kernels on N x C x 1 x L views.", { opts = "as conv_transpose2d, numbers or {n}",
   fmt = "contiguous (N x L x C strides when x or w has them)", err = ERR_CONVT })
E("lm.F.conv_transpose3d", "lm.F.conv_transpose3d(x, w, b, opts) -> Tensor", "As "
   .. "conv_transpose2d for x (N, C_in, D, H, W) or (C_in, D, H, W), w (C_in, C_out / groups, "
   .. "kD, kH, kW), on lm_conv3d_backward / lm_conv3d.", { opts = "as conv_transpose2d, numbers "
   .. "or {d, h, w}", fmt = FMT_CONVT, err = ERR_CONVT })
-- end of issue 40 (wt-resample) --------------------------------------------------------------

S("nn", "lm.nn: modules", [[
`m(x)` is `m:forward(x)`. Parameters and buffers carry PyTorch's key names, so state dicts match
torchvision's. `m:to(lm.channels_last)` converts the 4-D parameters (conv weights) and buffers;
then a channels-last input keeps channels-last through every layer here.]])
E("lm.nn", "lm.nn", "The module classes, lm.nn.functional, lm.nn.init, lm.nn.utils and "
   .. "fold_batch_norm.")
E("lm.nn.Module", "lm.nn.Module", "The base class: subclass with lm.nn.Module:extend(name), "
   .. "define __init(self, ...) and forward(self, ...). Assigning a module to a field registers "
   .. "it as a child.")
E("lm.nn.Parameter", "lm.nn.Parameter(t, requires_grad) -> t", "Mark t so that assigning it "
   .. "to a module field registers it as a parameter (requires_grad defaults to true).")
E("lm.nn.is_module", "lm.nn.is_module(x) -> boolean", "true for module instances.")
E("lm.nn.Conv2d", "lm.nn.Conv2d(in_channels, out_channels, kernel_size, opts)", "2-D "
   .. "convolution layer (weight (out, in/groups, kH, kW), bias (out)); forward(x, fuse) "
   .. "takes an optional {residual =, relu =, act =} (see lm.F.conv2d).",
   { opts = "{stride = 1, padding = 0, dilation = 1, groups = 1, bias = true, dtype = "
   .. "float32}", fmt = "weight contiguous until m:to(lm.channels_last); output as lm.F.conv2d",
   err = "non-positive sizes, channels not divisible by groups" })
E("lm.nn.BatchNorm2d", "lm.nn.BatchNorm2d(num_features, opts)", "Batch norm over 4-D input "
   .. "(weight, bias, buffers running_mean, running_var, num_batches_tracked).",
   { opts = "{eps = 1e-5, momentum = 0.1 (false: cumulative average), affine = true, "
   .. "track_running_stats = true}", fmt = FMT_NN })
E("lm.nn.GroupNorm", "lm.nn.GroupNorm(num_groups, num_channels, opts)", "lm.F.group_norm as "
   .. "a module (weight ones, bias zeros of num_channels when affine).",
   { opts = "{eps = 1e-5, affine = true, dtype, device}", fmt = "as lm.F.group_norm",
   err = "num_channels not divisible by num_groups" })
E("lm.nn.LayerNorm", "lm.nn.LayerNorm(normalized_shape, opts)", "lm.F.layer_norm as a module "
   .. "(weight ones, bias zeros of normalized_shape when elementwise_affine).",
   { opts = "{eps = 1e-5, elementwise_affine = true, bias = true, dtype, device}",
   fmt = "as lm.F.layer_norm" })
E("lm.nn.InstanceNorm2d", "lm.nn.InstanceNorm2d(num_features, opts)", "lm.F.instance_norm as "
   .. "a module over 4-D (or unbatched 3-D) input; weight / bias when affine, running_mean / "
   .. "running_var / num_batches_tracked when track_running_stats (then used in eval mode).",
   { opts = "{eps = 1e-5, momentum = 0.1, affine = false, track_running_stats = false, dtype, "
   .. "device}", fmt = "as lm.F.instance_norm", err = "other input ranks: `lumen."
   .. "InstanceNorm2d: expected 3D or 4D input (got 5D input)`" })
E("lm.nn.InstanceNorm1d", "lm.nn.InstanceNorm1d(num_features, opts)", "As lm.nn."
   .. "InstanceNorm2d over 3-D (N, C, L) or unbatched 2-D input.", { opts = "as lm.nn."
   .. "InstanceNorm2d" })
E("lm.nn.InstanceNorm3d", "lm.nn.InstanceNorm3d(num_features, opts)", "As lm.nn."
   .. "InstanceNorm2d over 5-D (or unbatched 4-D) input; channels_last_3d kept.",
   { opts = "as lm.nn.InstanceNorm2d" })
E("lm.nn.ReLU", "lm.nn.ReLU(inplace)", "relu as a module (inplace: boolean or {inplace =}).")
E("lm.nn.Sigmoid", "lm.nn.Sigmoid()", "sigmoid as a module.")
E("lm.nn.Tanh", "lm.nn.Tanh()", "tanh as a module.")
E("lm.nn.Softmax", "lm.nn.Softmax(dim)", "softmax along dim as a module.")
E("lm.nn.LogSoftmax", "lm.nn.LogSoftmax(dim)", "log_softmax along dim as a module.")
E("lm.nn.MaxPool2d", "lm.nn.MaxPool2d(opts) / lm.nn.MaxPool2d(kernel_size, stride, padding, "
   .. "dilation, ceil_mode)", "lm.F.max_pool2d as a module.", { opts = "as lm.F.max_pool2d" })
E("lm.nn.AvgPool2d", "lm.nn.AvgPool2d(opts) / lm.nn.AvgPool2d(kernel_size, stride, padding, "
   .. "...)", "lm.F.avg_pool2d as a module.", { opts = "as lm.F.avg_pool2d" })
E("lm.nn.AdaptiveAvgPool2d", "lm.nn.AdaptiveAvgPool2d(size)", "lm.F.adaptive_avg_pool2d as a "
   .. "module.")
E("lm.nn.AdaptiveMaxPool2d", "lm.nn.AdaptiveMaxPool2d(size, return_indices)", "lm.F."
   .. "adaptive_max_pool2d as a module (values only unless return_indices).")
E("lm.nn.Conv1d", "lm.nn.Conv1d(in_channels, out_channels, kernel_size, opts)", "1-D "
   .. "convolution layer (weight (out, in/groups, k), bias (out); PyTorch's init).",
   { opts = "{stride = 1, padding = 0 (a number, {n}, \"valid\" or \"same\"), dilation = 1, "
   .. "groups = 1, bias = true, dtype = float32}", fmt = "output as lm.F.conv1d",
   err = "non-positive sizes, channels not divisible by groups, padding='same' with a stride" })
E("lm.nn.Conv3d", "lm.nn.Conv3d(in_channels, out_channels, kernel_size, opts)", "3-D "
   .. "convolution layer (weight (out, in/groups, kD, kH, kW), bias (out); PyTorch's init); "
   .. "forward(x, fuse) takes an optional {residual =, relu =, act =} (see lm.F.conv3d).",
   { opts = "{stride = 1, padding = 0 (numbers or {d, h, w}; padding also \"valid\" or "
   .. "\"same\"), dilation = 1, groups = 1, bias = true, dtype = float32}",
   fmt = "weight contiguous until lm.to_channels_last(m) (channels_last_3d); output as "
   .. "lm.F.conv3d",
   err = "non-positive sizes, channels not divisible by groups, padding='same' with a stride" })
E("lm.nn.BatchNorm1d", "lm.nn.BatchNorm1d(num_features, opts)", "Batch norm over 2-D (N,C) or "
   .. "3-D (N,C,L) input; parameters, buffers and options as lm.nn.BatchNorm2d.",
   { opts = "as lm.nn.BatchNorm2d", fmt = "as lm.F.batch_norm (an N,L,C-strided input gives "
   .. "a contiguous output, as PyTorch)", err = "other input ranks: `lumen.BatchNorm1d: "
   .. "expected 2D or 3D input (got 4D input)`" })
E("lm.nn.BatchNorm3d", "lm.nn.BatchNorm3d(num_features, opts)", "Batch norm over 5-D input "
   .. "(N,C,D,H,W); parameters, buffers and options as lm.nn.BatchNorm2d.",
   { opts = "as lm.nn.BatchNorm2d", fmt = "a channels_last_3d input gives a channels_last_3d "
   .. "output and input gradient", err = "other input ranks: `lumen.BatchNorm3d: expected 5D "
   .. "input (got 4D input)`" })
E("lm.nn.MaxPool1d", "lm.nn.MaxPool1d(opts) / lm.nn.MaxPool1d(kernel_size, stride, padding, "
   .. "dilation, return_indices, ceil_mode)", "lm.F.max_pool1d as a module.",
   { opts = "as lm.F.max_pool1d" })
E("lm.nn.AvgPool1d", "lm.nn.AvgPool1d(opts) / lm.nn.AvgPool1d(kernel_size, stride, padding, "
   .. "ceil_mode, count_include_pad)", "lm.F.avg_pool1d as a module.",
   { opts = "as lm.F.avg_pool1d" })
E("lm.nn.AdaptiveAvgPool1d", "lm.nn.AdaptiveAvgPool1d(size)", "lm.F.adaptive_avg_pool1d as a "
   .. "module.")
E("lm.nn.AdaptiveMaxPool1d", "lm.nn.AdaptiveMaxPool1d(size, return_indices)", "lm.F."
   .. "adaptive_max_pool1d as a module (values only unless return_indices).")
E("lm.nn.Linear", "lm.nn.Linear(in_features, out_features, opts)", "x @ weight^T + bias.",
   { opts = "{bias = true, dtype = float32}" })
E("lm.nn.Dropout", "lm.nn.Dropout(p)", "lm.F.dropout(x, p, self.training) (p defaults to "
   .. "0.5).", { err = "p outside [0, 1]" })
E("lm.nn.Flatten", "lm.nn.Flatten(start_dim, end_dim)", "lm.F.flatten as a module (defaults 2, "
   .. "-1: 1-based, so dim 2 is PyTorch's start_dim=1).")
E("lm.nn.Identity", "lm.nn.Identity()", "Returns its input.")
E("lm.nn.CrossEntropyLoss", "lm.nn.CrossEntropyLoss(opts)", "m(logits, target) = "
   .. "lm.F.cross_entropy(logits, target, opts).")
E("lm.nn.NLLLoss", "lm.nn.NLLLoss(opts)", "m(log_probs, target) = lm.F.nll_loss(...).")
E("lm.nn.MSELoss", "lm.nn.MSELoss(opts)", "m(a, b) = lm.F.mse_loss(a, b, opts).")
E("lm.nn.L1Loss", "lm.nn.L1Loss(opts)", "m(a, b) = lm.F.l1_loss(a, b, opts).")
E("lm.nn.SmoothL1Loss", "lm.nn.SmoothL1Loss(opts)", "lm.F.smooth_l1_loss as a module "
   .. "({reduction =, beta =}).")
E("lm.nn.HuberLoss", "lm.nn.HuberLoss(opts)", "lm.F.huber_loss as a module ({reduction =, "
   .. "delta =}).")
E("lm.nn.BCELoss", "lm.nn.BCELoss(opts)", "lm.F.binary_cross_entropy as a module ({weight =, "
   .. "reduction =}; the weight is a buffer).")
E("lm.nn.BCEWithLogitsLoss", "lm.nn.BCEWithLogitsLoss(opts)", "lm.F.binary_cross_entropy_with_"
   .. "logits as a module ({weight =, reduction =, pos_weight =}; the tensors are buffers, so "
   .. "m:to(device) moves them).")
E("lm.nn.KLDivLoss", "lm.nn.KLDivLoss(opts)", "lm.F.kl_div as a module ({reduction =, "
   .. "log_target =}).")
E("lm.nn.ModuleList", "lm.nn.ModuleList({m1, m2, ...})", "Holds modules in a list, registered "
   .. "as children \"0\", \"1\", ... (PyTorch's state_dict keys); list[i] (1-based, negative from "
   .. "the end) reads and replaces, list:append(m), list:extend({...}), list:insert(i, m), "
   .. "list:len(), `for i, m in list:ipairs()`. No forward of its own.",
   { err = "an element that is not a Module, an index out of range on assignment" })
E("lm.nn.ModuleDict", "lm.nn.ModuleDict({name = m, ...}) / lm.nn.ModuleDict({{name, m}, ...})",
   "Holds modules by name (dict.name or dict:get(name)); a plain table's keys are registered in "
   .. "sorted order (Lua tables have none), a list of pairs in its order; dict:update(t), "
   .. "dict:keys(), dict:values(), dict:items(), dict:len(), dict:contains(name), "
   .. "dict:pop(name). No forward of its own.", { err = "a value that is not a Module, a key "
   .. "that is not a string" })
E("lm.nn.LogSigmoid", "lm.nn.LogSigmoid()", "lm.F.logsigmoid as a module.")
E("lm.nn.Softsign", "lm.nn.Softsign()", "lm.F.softsign as a module.")
E("lm.nn.Tanhshrink", "lm.nn.Tanhshrink()", "lm.F.tanhshrink as a module.")
E("lm.nn.Softshrink", "lm.nn.Softshrink(lambd)", "lm.F.softshrink as a module (0.5).")
E("lm.nn.Hardshrink", "lm.nn.Hardshrink(lambd)", "lm.F.hardshrink as a module (0.5).")
E("lm.nn.Threshold", "lm.nn.Threshold(threshold, value, inplace)", "lm.F.threshold as a module "
   .. "(or {threshold =, value =, inplace =}).")
E("lm.nn.GLU", "lm.nn.GLU(dim)", "lm.F.glu as a module (dim -1).")
E("lm.nn.Softmin", "lm.nn.Softmin(dim)", "lm.F.softmin as a module.")
E("lm.nn.PReLU", "lm.nn.PReLU(num_parameters, init)", "lm.F.prelu with a learned weight of "
   .. "num_parameters (1, or the channel count) values, init 0.25 (or {num_parameters =, init =, "
   .. "dtype =, device =}).")
E("lm.nn.CosineSimilarity", "lm.nn.CosineSimilarity(dim, eps)", "lm.F.cosine_similarity as a "
   .. "module (2, 1e-8).")
E("lm.nn.PairwiseDistance", "lm.nn.PairwiseDistance(p, eps, keepdim)", "lm.F.pairwise_distance "
   .. "as a module (2, 1e-6, false).")
for _, kind in ipairs({ "Zero", "Constant", "Reflection", "Replication", "Circular" }) do
   for k = 1, 3 do
      local mode = ({ Zero = "constant (0)", Constant = "constant (value)",
                      Reflection = "reflect", Replication = "replicate",
                      Circular = "circular" })[kind]
      E(("lm.nn.%sPad%dd"):format(kind, k), ("lm.nn.%sPad%dd(padding%s)"):format(kind, k,
         kind == "Constant" and ", value" or ""), ("lm.F.pad in mode %s over the last %d "
         .. "dim%s: padding a number (every side) or %d numbers, last dim first (PyTorch's "
         .. "order)."):format(mode, k, k > 1 and "s" or "", 2 * k),
         { err = "padding of another length, a " .. (k + 1) .. "-D or " .. (k + 2)
         .. "-D input expected" })
   end
end
E("lm.nn.Embedding", "lm.nn.Embedding(num_embeddings, embedding_dim, opts)", "A learned table "
   .. "looked up by 1-based indices (lm.F.embedding); weight from N(0, 1), the padding_idx row "
   .. "zero. lm.nn.Embedding.from_pretrained(weights, {freeze = true, padding_idx =}) makes one "
   .. "from a 2-D tensor (a copy).", { opts = "{padding_idx =, dtype =, device =}",
   err = "sizes that are not non-negative integers, padding_idx outside num_embeddings, "
   .. "max_norm / scale_grad_by_freq / sparse" })
E("lm.nn.Unflatten", "lm.nn.Unflatten(dim, unflattened_size)", "Tensor:unflatten as a module.")
E("lm.nn.Sequential", "lm.nn.Sequential(m1, m2, ...) / lm.nn.Sequential({m1, ...})", "Runs its "
   .. "children in order; children are named \"0\", \"1\", ... (PyTorch's keys); seq[i] "
   .. "(1-based) is the i-th; seq:add(m), seq:size(), seq:get(i).")
E("lm.nn.DataParallel", "lm.nn.DataParallel(module, devices, opts) -> Module", "torch.nn."
   .. "DataParallel in one process: forward scatters every tensor argument along dim over the "
   .. "devices (lm.comm.scatter), runs a replica of module on each (replica 1 is module itself; "
   .. "the others hold differentiable copies p:to(device) of its parameters and copies of its "
   .. "buffers), one after the other, and gathers the outputs on output_device. Backward sums "
   .. "the replicas' gradients into module's parameters on devices[1]. The device list may name "
   .. "one device several times ({\"cpu\", \"cpu\"}).",
   { opts = "{output_device = devices[1], dim = 1}",
     fmt = "chunks and the gathered output keep the memory format (channels-last stays "
     .. "channels-last)",
     note = "as in PyTorch, buffer updates made in forward (batch-norm running statistics) are "
     .. "kept from replica 1 only: the other replicas update copies, which are lost; batch norm "
     .. "in training mode uses each chunk's own statistics. module's parameters and buffers must "
     .. "be on devices[1]. state_dict keys are \"module.<name>\" (PyTorch's).",
     err = "`lumen.nn.DataParallel: <problem>`: module not a Module, an empty or unknown "
     .. "device list, an unknown option, module not on devices[1], no tensor argument" })
E("lm.nn.parallel", "lm.nn.parallel", "The data-parallel modules: DataParallel (one process, "
   .. "several devices), DistributedDataParallel (several processes) and SyncBatchNorm.")
E("lm.nn.parallel.DistributedDataParallel", "lm.nn.parallel.DistributedDataParallel(module, "
   .. "opts) -> Module (also lm.nn.DistributedDataParallel)", "PyTorch's "
   .. "DistributedDataParallel on lm.distributed (init first; one replica per process): at wrap "
   .. "time the ranks check that their modules match and rank 0's parameters and buffers are "
   .. "broadcast; backward leaves in every parameter's .grad the mean over the ranks. The "
   .. "gradients are grouped in buckets (reverse parameter order, the first one at most 1 MB); "
   .. "a bucket's non-blocking all-reduce starts as soon as its last gradient is ready "
   .. "(post-accumulate-grad hooks), while backward goes on, and backward waits for all of them "
   .. "at its end (lm.autograd.queue_callback). ddp:no_sync(fn, ...) runs fn without "
   .. "communication (gradient accumulation); ddp.stats counts the all-reduces started during "
   .. "and after the last backward; ddp:bucket_sizes() lists the buckets in MB.",
   { opts = "{bucket_cap_mb = 25, broadcast_buffers = true (rank 0's buffers to every rank "
     .. "before each training forward), overlap = true (false: every all-reduce after backward)}",
     fmt = "each .grad is a view of its bucket with its parameter's strides (channels-last "
     .. "weights keep channels-last gradients)",
     note = "each forward in grad mode arms one backward; a parameter that took no part "
     .. "in a backward contributes zeros; batch norm uses each rank's own batch statistics "
     .. "(as PyTorch) unless converted to SyncBatchNorm. state_dict keys are \"module.<name>\".",
     err = "`lumen.nn.DistributedDataParallel: <problem>`: not initialized, the modules "
     .. "differ across ranks (on every rank), module not a Module, an unknown option, "
     .. "bucket_cap_mb not positive" })
E("lm.nn.SyncBatchNorm", "lm.nn.SyncBatchNorm(num_features, opts) -> Module", "Batch norm "
   .. "whose training statistics are those of the global batch: per-channel sums are "
   .. "all-reduced over the ranks (forward: the mean, then the variance; backward through the "
   .. "same all-reduces). Outside a job of more than one rank, or in evaluation mode, it is "
   .. "BatchNorm2d (for any input of 2 or more dims). "
   .. "lm.nn.SyncBatchNorm.convert_sync_batchnorm(module) -> module replaces every "
   .. "BatchNorm1d/2d/3d in the tree by one holding the same parameters and buffers.",
   { opts = "BatchNorm2d's", fmt = "the output follows the input's layout",
     err = "an input of fewer than 2 dims; a rank that skips it blocks the others" })
E("lm.nn.fold_batch_norm", "lm.nn.fold_batch_norm(model) -> model, n", "Fold every "
   .. "Conv2d -> BatchNorm2d and Conv3d -> BatchNorm3d pair into the convolution, in place, for "
   .. "inference (n: pairs folded); see docs/inference.md. In evaluation with gradients off a "
   .. "Sequential's convolution followed by ReLU, ReLU6, SiLU, Hardswish, Hardsigmoid, Sigmoid "
   .. "or GELU (folded or not) runs that activation in the convolution's epilogue.",
   { err = "the model is in training mode (call model:eval() first); nothing is changed then",
   fmt = "the folded weights keep the convolution's layout (channels_last, channels_last_3d)" })
E("lm.nn.utils", "lm.nn.utils", "fuse_conv_bn_eval, fuse_conv_bn_weights, clip_grad_norm_, "
   .. "clip_grad_value_, parameters_to_vector, vector_to_parameters (PyTorch's torch.nn.utils "
   .. "names) and the folding helpers.")
E("lm.nn.utils.fuse_conv_bn_eval", "lm.nn.utils.fuse_conv_bn_eval(conv, bn) -> Conv2d or "
   .. "Conv3d", "A new convolution computing bn(conv(x)) (Conv2d with BatchNorm2d, Conv3d with "
   .. "BatchNorm3d); conv and bn are not changed.", { err = "either module in training mode, bn "
   .. "without running statistics, a pair of the wrong kinds or sizes" })
E("lm.nn.utils.fuse_conv_bn_weights", "lm.nn.utils.fuse_conv_bn_weights(conv_w, conv_b, "
   .. "bn_rm, bn_rv, bn_eps, bn_w, bn_b) -> w, b", "The folded weight and bias (conv_b, bn_w, "
   .. "bn_b may be nil); conv_w of any rank (4-D, 5-D).", { fmt = "w has conv_w's strides "
   .. "(channels_last stays channels_last, channels_last_3d stays channels_last_3d)" })
E("lm.nn.utils.can_fold_all", "lm.nn.utils.can_fold_all(pairs) -> boolean", "Whether every "
   .. "{conv, bn} pair of the array can be folded (a block folds all its pairs or none).")
E("lm.nn.utils.fold_pair_", "lm.nn.utils.fold_pair_(conv, bn) -> ok, why", "Fold bn into conv "
   .. "in place: true when folded, false and the reason when it cannot be (for model classes "
   .. "that define their own fold_batch_norm).")
E("lm.nn.utils.fold_named_", "lm.nn.utils.fold_named_(module, conv_name, bn_name) -> boolean",
   "Fold module[bn_name] into module[conv_name] and put an Identity (in evaluation mode) in "
   .. "the batch norm's place; false when it cannot be folded.")
E("lm.nn.utils.bn_relu", "lm.nn.utils.bn_relu(bn, relu, x, residual) -> tensor",
   "relu(bn(x) + residual) (residual may be nil), the tail of a ResNet block: one fused batch "
   .. "norm pass forward and one backward (bn:forward(x, {residual =, relu = true})) when bn is "
   .. "a BatchNorm1d/2d/3d or SyncBatchNorm and relu a plain nn.ReLU, else the modules op by op. "
   .. "lm.models' ResNet blocks use it when not folded, in training and evaluation.",
   { fmt = "the result and the gradients keep x's memory format (channels_last stays "
     .. "channels_last)" })
E("lm.nn.utils.clip_grad_norm_", "lm.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, "
   .. "error_if_nonfinite) -> Tensor  (or ..., {norm_type =, error_if_nonfinite =, foreach =})",
   "Scale the gradients of parameters (a tensor or a list, e.g. model:parameters()) in place so "
   .. "that their total norm (the norm_type norm, 2 by default, of the gradients' norms) is at "
   .. "most max_norm: each is multiplied by min(1, max_norm / (total + 1e-6)), as PyTorch's. "
   .. "Returns the total norm before clipping (0-d); parameters without a gradient are skipped.",
   { err = "parameters that are not tensors, max_norm or norm_type not numbers, gradients on "
   .. "different devices, a non-finite total with error_if_nonfinite = true" })
E("lm.nn.utils.clip_grad_value_", "lm.nn.utils.clip_grad_value_(parameters, clip_value)",
   "Clamp each gradient to [-clip_value, clip_value] in place.",
   { err = "parameters that are not tensors, clip_value not a number" })
E("lm.nn.utils.parameters_to_vector", "lm.nn.utils.parameters_to_vector(parameters) -> Tensor",
   "The parameters flattened and joined into one 1-D tensor (a copy).",
   { err = "no parameters, parameters on different devices" })
E("lm.nn.utils.vector_to_parameters", "lm.nn.utils.vector_to_parameters(vec, parameters)",
   "Copy consecutive slices of the 1-D vec into the parameters (in place, outside autograd).",
   { err = "vec not 1-D, a number of elements that differs from the parameters'" })
E("lm.nn.init", "lm.nn.init", "Weight initialisers (PyTorch's torch.nn.init), in place, from "
   .. "the global generator.")
E("lm.nn.init.calculate_gain", "lm.nn.init.calculate_gain(nonlinearity, param) -> number",
   "The recommended gain for a nonlinearity (\"relu\", \"leaky_relu\", \"tanh\", ...).")
E("lm.nn.init.calculate_fan_in_and_fan_out", "lm.nn.init.calculate_fan_in_and_fan_out(t) -> "
   .. "fan_in, fan_out", "Fans of a weight tensor.", { err = "fewer than 2 dims" })
E("lm.nn.init.uniform_", "lm.nn.init.uniform_(t, a, b) -> t", "U(a, b) (defaults 0, 1).")
E("lm.nn.init.normal_", "lm.nn.init.normal_(t, mean, std) -> t", "N(mean, std) (defaults 0, 1).")
E("lm.nn.init.constant_", "lm.nn.init.constant_(t, v) -> t", "Fill with v.")
E("lm.nn.init.ones_", "lm.nn.init.ones_(t) -> t", "Fill with 1.")
E("lm.nn.init.zeros_", "lm.nn.init.zeros_(t) -> t", "Fill with 0.")
E("lm.nn.init.xavier_uniform_", "lm.nn.init.xavier_uniform_(t, gain) -> t", "Glorot uniform.")
E("lm.nn.init.xavier_normal_", "lm.nn.init.xavier_normal_(t, gain) -> t", "Glorot normal.")
E("lm.nn.init.kaiming_uniform_", "lm.nn.init.kaiming_uniform_(t, a, mode, nonlinearity) -> t",
   "He uniform (PyTorch's defaults: a = 0, mode = \"fan_in\", nonlinearity = \"leaky_relu\").")
E("lm.nn.init.kaiming_normal_", "lm.nn.init.kaiming_normal_(t, a, mode, nonlinearity) -> t",
   "He normal.")

-- issue 40 (wt-act): activation, shuffle and feature-dropout modules -------------------------
E("lm.nn.SiLU", "lm.nn.SiLU(inplace)", "lm.F.silu as a module (inplace: boolean or {inplace =}).")
E("lm.nn.GELU", "lm.nn.GELU(approximate)", "lm.F.gelu as a module (\"none\" or \"tanh\", or "
   .. "{approximate =}).")
E("lm.nn.Hardswish", "lm.nn.Hardswish(inplace)", "lm.F.hardswish as a module.")
E("lm.nn.Hardsigmoid", "lm.nn.Hardsigmoid(inplace)", "lm.F.hardsigmoid as a module.")
E("lm.nn.ReLU6", "lm.nn.ReLU6(inplace)", "lm.F.relu6 as a module.")
E("lm.nn.LeakyReLU", "lm.nn.LeakyReLU(negative_slope, inplace)", "lm.F.leaky_relu as a module "
   .. "(negative_slope 0.01 by default; or {negative_slope =, inplace =}).")
E("lm.nn.ELU", "lm.nn.ELU(alpha, inplace)", "lm.F.elu as a module (alpha 1 by default; or "
   .. "{alpha =, inplace =}).")
E("lm.nn.Mish", "lm.nn.Mish(inplace)", "lm.F.mish as a module.")
E("lm.nn.Hardtanh", "lm.nn.Hardtanh(min_val, max_val, inplace)", "lm.F.hardtanh as a module "
   .. "(-1 and 1 by default; or {min_val =, max_val =, inplace =}).",
   { err = "min_val greater than max_val, a bound not a number" })
E("lm.nn.Softplus", "lm.nn.Softplus(beta, threshold)", "lm.F.softplus as a module (1 and 20 by "
   .. "default; or {beta =, threshold =}).")
E("lm.nn.SELU", "lm.nn.SELU(inplace)", "lm.F.selu as a module.")
E("lm.nn.CELU", "lm.nn.CELU(alpha, inplace)", "lm.F.celu as a module (alpha 1 by default; or "
   .. "{alpha =, inplace =}).")
E("lm.nn.PixelShuffle", "lm.nn.PixelShuffle(upscale_factor)", "lm.F.pixel_shuffle as a module.")
E("lm.nn.PixelUnshuffle", "lm.nn.PixelUnshuffle(downscale_factor)", "lm.F.pixel_unshuffle as a "
   .. "module.")
E("lm.nn.ChannelShuffle", "lm.nn.ChannelShuffle(groups)", "lm.F.channel_shuffle as a module.")
E("lm.nn.Dropout1d", "lm.nn.Dropout1d(p, inplace)", "lm.F.dropout1d as a module.",
   { err = "p outside [0, 1]" })
E("lm.nn.Dropout2d", "lm.nn.Dropout2d(p, inplace)", "lm.F.dropout2d(x, p, self.training, "
   .. "inplace) (p 0.5 by default; or {p =, inplace =}).", { err = "p outside [0, 1]" })
E("lm.nn.Dropout3d", "lm.nn.Dropout3d(p, inplace)", "lm.F.dropout3d as a module.",
   { err = "p outside [0, 1]" })
-- end of issue 40 (wt-act) -------------------------------------------------------------------
-- issue 40 (wt-resample): Upsample, ConvTranspose modules -------------------------------------
E("lm.nn.Upsample", "lm.nn.Upsample(opts)", "lm.F.interpolate with opts {size =, scale_factor "
   .. "=, mode = \"nearest\", align_corners =, recompute_scale_factor =} as a module; or "
   .. "PyTorch's positional Upsample(size, scale_factor, mode, align_corners, "
   .. "recompute_scale_factor). The output keeps the input's memory format.",
   { err = "neither size nor scale_factor, an unknown option" })
E("lm.F.upsample_nearest", "lm.F.upsample_nearest(x, size, scale_factor) -> Tensor",
   "PyTorch's deprecated spelling of interpolate's nearest mode (or upsample_nearest(x, {size =, "
   .. "scale_factor =})).", { fmt = "the output keeps the input's memory format" })
E("lm.F.upsample_bilinear", "lm.F.upsample_bilinear(x, size, scale_factor) -> Tensor",
   "PyTorch's deprecated spelling of interpolate's bilinear mode with align_corners = true (or "
   .. "upsample_bilinear(x, {size =, scale_factor =})).",
   { fmt = "the output keeps the input's memory format" })
E("lm.nn.UpsamplingNearest2d", "lm.nn.UpsamplingNearest2d(opts)", "Upsample with mode "
   .. "\"nearest\" ({size =} or {scale_factor =}, or positional (size, scale_factor)).")
E("lm.nn.UpsamplingBilinear2d", "lm.nn.UpsamplingBilinear2d(opts)", "Upsample with mode "
   .. "\"bilinear\" and align_corners = true ({size =} or {scale_factor =}, or positional "
   .. "(size, scale_factor)).")
E("lm.nn.ConvTranspose2d", "lm.nn.ConvTranspose2d(in_channels, out_channels, kernel_size, opts)",
   "weight (in, out / groups, kH, kW) and bias (out) initialised as PyTorch's; forward "
   .. "lm.F.conv_transpose2d. m:forward(x, output_size) (or m(x, output_size)) picks the "
   .. "output_padding per dim that gives output_size, as PyTorch's: output_size is a table of "
   .. "the spatial sizes {h, w} or of the whole output's N, C, H, W (N and C are not read; "
   .. "t:size() of a skip connection works), each in min..min + stride - 1, min the size with "
   .. "no output padding; the module's output_padding is then ignored.",
   { opts = "{stride = 1, padding = 0, output_padding = 0, groups = "
   .. "1, bias = true, dilation = 1, dtype =, device =} (padding_mode \"zeros\" only)",
   err = "channels not divisible by groups, sizes that are not positive integers; "
   .. "output_size with the wrong number of elements, not integers, or outside the valid "
   .. "range (\"requested an output size of {9, 7}, but valid sizes range from {7, 7} to "
   .. "{8, 8} (for an input of {4, 4})\")" })
E("lm.nn.ConvTranspose1d", "lm.nn.ConvTranspose1d(in_channels, out_channels, kernel_size, opts)",
   "As ConvTranspose2d, 1-D (lm.F.conv_transpose1d); forward(x, output_size) with output_size "
   .. "{l} or {N, C, l}.")
E("lm.nn.ConvTranspose3d", "lm.nn.ConvTranspose3d(in_channels, out_channels, kernel_size, opts)",
   "As ConvTranspose2d, 3-D (lm.F.conv_transpose3d); forward(x, output_size) with output_size "
   .. "{d, h, w} or {N, C, d, h, w}.")
-- end of issue 40 (wt-resample) --------------------------------------------------------------

S("module_methods", "Module methods", "")
local MM = {
   { "extend", "Module:extend(name) -> class", "A new module class inheriting from this one." },
   { "forward", "m:forward(...)", "The computation; m(...) calls it." },
   { "type_name", "m:type_name() -> string", "The class name (\"Conv2d\")." },
   { "register_parameter", "m:register_parameter(name, t)", "t (or nil) becomes a parameter: "
     .. "a leaf that requires grad, saved in state_dict." },
   { "register_buffer", "m:register_buffer(name, t, persistent)", "t becomes a buffer (saved in "
     .. "state_dict unless persistent is false)." },
   { "add_module", "m:add_module(name, child)", "Register a child module (alias "
     .. "register_module)." },
   { "named_children", "m:named_children() -> array of {name, module}", "The direct children." },
   { "children", "m:children() -> array", "The direct children." },
   { "named_modules", "m:named_modules() -> array of {path, module}", "Every module, self first "
     .. "(path \"\"), depth first." },
   { "modules", "m:modules() -> array", "Every module, self first." },
   { "named_parameters", "m:named_parameters() -> array of {name, tensor}", "Parameters in "
     .. "registration order (shared ones once), with dotted names." },
   { "parameters", "m:parameters() -> array", "The parameters." },
   { "named_buffers", "m:named_buffers() -> array of {name, tensor}", "The buffers." },
   { "buffers", "m:buffers() -> array", "The buffers." },
   { "apply", "m:apply(fn) -> m", "fn(module) on every submodule (children first) and m." },
   { "train", "m:train(flag) -> m", "Training mode on (flag true or nil) or off, recursively." },
   { "eval", "m:eval() -> m", "m:train(false)." },
   { "zero_grad", "m:zero_grad(set_to_none)", "Zero the parameters' gradients in place (or drop "
     .. "them with set_to_none)." },
   { "requires_grad_", "m:requires_grad_(flag) -> m", "Set requires_grad on every parameter." },
   { "to", "m:to(x, ...) -> m", "Convert parameters and buffers in place: a dtype (floating ones "
     .. "only: m:to(lm.bfloat16) leaves num_batches_tracked int64), a memory format (4-D "
     .. "tensors for channels_last, 5-D for channels_last_3d), a device, or {dtype =, "
     .. "memory_format =, device =}. As PyTorch's Module.to: the same parameter objects, "
     .. "their data (and .grad) replaced; a device copy keeps each tensor's memory format." },
   { "float", "m:float() -> m", "m:to(lm.float32)." },
   { "double", "m:double() -> m", "m:to(lm.float64)." },
   { "half", "m:half() -> m", "m:to(lm.float16)." },
   { "bfloat16", "m:bfloat16() -> m", "m:to(lm.bfloat16)." },
   { "cpu", "m:cpu() -> m", "m:to(\"cpu\")." },
   { "state_entries", "m:state_entries() -> array of {key, tensor}", "Parameters and persistent "
     .. "buffers in PyTorch's state_dict order." },
   { "state_dict", "m:state_dict() -> table", "key -> tensor (detached, sharing storage), "
     .. "torchvision's key names." },
   { "state_keys", "m:state_keys() -> array", "The state_dict keys in PyTorch's order." },
   { "load_state_dict", "m:load_state_dict(sd, opts) -> {missing_keys, unexpected_keys}", "Copy "
     .. "values into the existing tensors (they keep their dtype and memory format)." },
   { "extra_repr", "m:extra_repr() -> string", "The text inside the parentheses when printed." },
   { "repr", "m:repr() -> string", "The printed tree (tostring(m))." },
   { "fold_batch_norm", "m:fold_batch_norm()", "Fold the batch norms inside m (lm.nn."
     .. "fold_batch_norm calls it; modules with their own data flow override it)." },
}
for _, mm in ipairs(MM) do
   local more
   if mm[1] == "to" then
      more = { fmt = "channels_last converts the 4-D tensors and channels_last_3d the 5-D ones "
         .. "(tensors of lower rank are left as they are, one of the other rank raises the rank "
         .. "error); a dtype conversion keeps each tensor's layout",
         err = "an unknown dtype/format/device" }
   elseif mm[1] == "load_state_dict" then
      more = { opts = "{strict = true}", err = "strict and keys missing or unexpected; a "
         .. "tensor of the wrong size" }
   end
   E("Module:" .. mm[1], mm[2], mm[3], more)
end

S("optim", "lm.optim", [[
Optimizers with PyTorch 1.13's update formulas. State (momentum buffers, Adam moments) is
allocated like its parameter: same memory format.]])
local PARAMS = "params: an array of tensors, a Module (its parameters), or an array of groups "
   .. "{params = {...}, lr = ..., ...}"
E("lm.optim", "lm.optim", "SGD, Adam, AdamW and the Optimizer base class.")
E("lm.optim.SGD", "lm.optim.SGD(params, opts) -> optimizer", "Stochastic gradient descent "
   .. "(momentum, Nesterov, weight decay).", { opts = "{lr (required), momentum = 0, "
   .. "dampening = 0, weight_decay = 0, nesterov = false, maximize = false, capturable = "
   .. "false}; capturable = true reads the learning rate from a tensor on the parameters' device "
   .. "when the step runs, so a CUDA graph that captured opt:step() follows lr changes "
   .. "(schedulers) at each replay (take one eager step before capturing); " .. PARAMS,
   fmt = "momentum buffers have their parameter's layout",
   err = "lr missing, negative lr/momentum/weight_decay, nesterov without momentum or with "
   .. "dampening, an empty parameter list" })
E("lm.optim.Adam", "lm.optim.Adam(params, opts) -> optimizer", "Adam.",
   { opts = "{lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, amsgrad = false, "
   .. "maximize = false, capturable = false}; capturable = true keeps the learning rate and the "
   .. "step count in tensors on the parameters' device, read by the step when it runs, so a "
   .. "CUDA graph that captured opt:step() takes the right lr and bias corrections at every "
   .. "replay (take one eager step before capturing; state_dict reads the count back); "
   .. PARAMS, fmt = "moments have their parameter's layout",
   err = "values out of range (betas in [0, 1), eps >= 0, ...)" })
E("lm.optim.AdamW", "lm.optim.AdamW(params, opts) -> optimizer", "Adam with decoupled weight "
   .. "decay.", { opts = "as Adam, weight_decay = 1e-2" })
E("lm.optim.RMSprop", "lm.optim.RMSprop(params, opts) -> optimizer", "PyTorch's RMSprop, step "
   .. "for step (composed from tensor ops: any device, dtype and layout; its state keeps the "
   .. "parameter's layout).", { opts = "{lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, "
   .. "momentum = 0, centered = false, maximize = false}" })
E("lm.optim.Adagrad", "lm.optim.Adagrad(params, opts) -> optimizer", "PyTorch's Adagrad, step "
   .. "for step.", { opts = "{lr = 1e-2, lr_decay = 0, weight_decay = 0, "
   .. "initial_accumulator_value = 0, eps = 1e-10, maximize = false}" })
E("lm.optim.Optimizer", "lm.optim.Optimizer", "The base class: "
   .. "Optimizer.class(name, defaults, update, validate) makes a new optimizer class; update("
   .. "group, p, grad, state) is called for every parameter with a gradient, autograd off.")
E("Optimizer:class", "Optimizer.class(name, defaults, update, validate) -> class", "A new "
   .. "optimizer class (a defaults value of Optimizer.REQUIRED must be given by the user).")
E("Optimizer:new", "Optimizer.new(cls, params, opts) -> optimizer", "What calling a class "
   .. "does.")
E("Optimizer:REQUIRED", "Optimizer.REQUIRED", "Marker for a hyper-parameter without a default.")
E("Optimizer:add_param_group", "opt:add_param_group(group)", "Add {params = {...}, <options>}.")
E("Optimizer:zero_grad", "opt:zero_grad(set_to_none)", "Zero (or drop) every parameter's "
   .. "gradient.")
E("Optimizer:step", "opt:step(closure) -> loss", "One update of every parameter that has a "
   .. "gradient; closure (optional) re-evaluates the loss with autograd on.")
E("Optimizer:state_dict", "opt:state_dict() -> {state, param_groups}", "The state (copies) and "
   .. "groups; parameters numbered 1, 2, ... across groups.")
E("Optimizer:load_state_dict", "opt:load_state_dict(sd)", "Restore a state_dict; tensors are "
   .. "converted to their parameter's dtype and memory format.",
   { err = "groups that differ in number or sizes" })

S("lr_scheduler", "lm.optim.lr_scheduler", [[
PyTorch's learning-rate schedules, with its keyword arguments as option names and its values,
step by step (spec/lr_scheduler_spec.lua compares every step with PyTorch 2.x). Build one on an
optimizer, call `sched:step()` after `opt:step()` (once per epoch; OneCycleLR once per batch;
ReduceLROnPlateau `sched:step(metric)`). Each sets `opt.param_groups[i].lr`; a rate can also be
set by hand there (`opt.param_groups[1].lr = 0.01`): the chainable schedules (StepLR,
ExponentialLR, ...) continue from it, as PyTorch's do. Every scheduler has `sched:step()`,
`sched:get_last_lr()` (an array, one lr per group), `sched.last_epoch`, `sched.base_lrs`,
`sched:state_dict()` (a plain table that lm.save_checkpoint saves) and
`sched:load_state_dict(sd)`. Every constructor also takes `last_epoch = -1`; an unknown option
is an error naming it.]])
local SCHED_ERR = "an unknown option, a missing required one, a value of the wrong type or out "
   .. "of range: `lumen.optim.lr_scheduler.<Name>: <problem>`"
E("lm.optim.lr_scheduler", "lm.optim.lr_scheduler", "The learning-rate schedules (StepLR, "
   .. "MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, PolynomialLR, "
   .. "CosineAnnealingWarmRestarts, OneCycleLR, LambdaLR, ReduceLROnPlateau, SequentialLR) and "
   .. "their base class LRScheduler.")
E("lm.optim.lr_scheduler.LRScheduler", "lm.optim.lr_scheduler.LRScheduler", "The base class: "
   .. "step(), get_last_lr(), state_dict(), load_state_dict(sd); a schedule defines get_lr() "
   .. "(the chainable form) and optionally _get_closed_form_lr(), as PyTorch's.")
E("lm.optim.lr_scheduler.StepLR", "StepLR(opt, {step_size =, gamma = 0.1}) -> scheduler",
   "Multiply every group's lr by gamma every step_size steps.", { err = SCHED_ERR })
E("lm.optim.lr_scheduler.MultiStepLR", "MultiStepLR(opt, {milestones =, gamma = 0.1}) -> "
   .. "scheduler", "Multiply by gamma at each milestone (an array of epochs; a milestone listed "
   .. "twice multiplies twice).", { err = SCHED_ERR })
E("lm.optim.lr_scheduler.ExponentialLR", "ExponentialLR(opt, {gamma =}) -> scheduler",
   "Multiply by gamma every step.", { err = SCHED_ERR })
E("lm.optim.lr_scheduler.CosineAnnealingLR", "CosineAnnealingLR(opt, {T_max =, eta_min = 0}) -> "
   .. "scheduler", "Cosine from the initial lr down to eta_min over T_max steps, then back up "
   .. "(PyTorch's recursive form).", { err = SCHED_ERR })
E("lm.optim.lr_scheduler.LinearLR", "LinearLR(opt, {start_factor = 1/3, end_factor = 1, "
   .. "total_iters = 5}) -> scheduler", "Scale the lr linearly from start_factor to end_factor "
   .. "over total_iters steps (a warm-up).", { err = SCHED_ERR })
E("lm.optim.lr_scheduler.PolynomialLR", "PolynomialLR(opt, {total_iters = 5, power = 1}) -> "
   .. "scheduler", "Decay to 0 over total_iters steps with the given power.", { err = SCHED_ERR })
E("lm.optim.lr_scheduler.CosineAnnealingWarmRestarts", "CosineAnnealingWarmRestarts(opt, {T_0 =, "
   .. "T_mult = 1, eta_min = 0}) -> scheduler", "SGDR: cosine over T_0 steps, restarting, each "
   .. "period T_mult times longer. sched:step(epoch) also takes a fractional epoch (epoch + "
   .. "i / iters within an epoch).", { err = SCHED_ERR })
E("lm.optim.lr_scheduler.OneCycleLR", "OneCycleLR(opt, {max_lr =, total_steps = | epochs = and "
   .. "steps_per_epoch =, pct_start = 0.3, anneal_strategy = \"cos\", div_factor = 25, "
   .. "final_div_factor = 1e4, three_phase = false, cycle_momentum = true, base_momentum = 0.85, "
   .. "max_momentum = 0.95}) -> scheduler", "The 1cycle policy, stepped once per batch: lr up "
   .. "from max_lr/div_factor to max_lr, then down to initial/final_div_factor; with "
   .. "cycle_momentum the momentum (beta1 for Adam) goes the other way between max_momentum and "
   .. "base_momentum. max_lr and the momenta may be one per group. Sets initial_lr, max_lr, "
   .. "min_lr, max_momentum, base_momentum in each group, as PyTorch.",
   { err = SCHED_ERR .. "; stepping past total_steps (`tried to step N times`)" })
E("lm.optim.lr_scheduler.LambdaLR", "LambdaLR(opt, {lr_lambda = function(epoch) -> factor}) -> "
   .. "scheduler", "lr = initial lr * lr_lambda(epoch); lr_lambda may be an array, one function "
   .. "per group. state_dict leaves the functions out.", { err = SCHED_ERR })
E("lm.optim.lr_scheduler.ReduceLROnPlateau", "ReduceLROnPlateau(opt, {mode = \"min\", factor = "
   .. "0.1, patience = 10, threshold = 1e-4, threshold_mode = \"rel\", cooldown = 0, min_lr = "
   .. "0, eps = 1e-8}) -> scheduler", "Multiply the lr by factor when sched:step(metric) has not "
   .. "improved for patience steps (metric: a number or a one-element tensor, e.g. the "
   .. "validation loss); min_lr may be one per group.", { err = SCHED_ERR .. "; step() without "
   .. "a metric" })
E("lm.optim.lr_scheduler.SequentialLR", "SequentialLR(opt, {schedulers = {...}, milestones = "
   .. "{...}}) -> scheduler", "Run schedulers one after another, switching at the milestones "
   .. "(one fewer than schedulers); e.g. a LinearLR warm-up then CosineAnnealingLR.",
   { err = SCHED_ERR .. "; a ReduceLROnPlateau or a scheduler of another optimizer among them" })

S("amp", "Mixed precision: lm.autocast, lm.amp", [[
Automatic mixed precision as PyTorch's torch.autocast and torch.amp.GradScaler
(docs/mixed_precision.md: what runs in which precision, a training loop, the accuracy to expect).
Inside `lm.autocast`, conv2d, linear and matmul run in bfloat16 (or float16); softmax,
log_softmax, the losses and sum / prod / exp / log / pow in float32; everything else follows its
inputs. Parameters stay float32 and get float32 gradients.]])
E("lm.autocast", "lm.autocast(opts, fn, ...) -> ...", "Run fn(...) with autocast on and "
   .. "return its results; lm.autocast(fn, ...) uses the defaults.",
   { opts = "{dtype = lm.bfloat16 on \"cpu\", lm.float16 on \"cuda\", device = the default "
     .. "device's type (\"cpu\" covers cpu, meta and sim:N; \"cuda\" covers cuda:N), enabled "
     .. "= true, cache_enabled = true}",
     err = "a dtype other than bfloat16 / float16, an unknown option or device, fn not a "
     .. "function: `lumen.autocast: <problem>`; an error inside fn propagates unchanged, with "
     .. "the previous state restored",
     note = "regions nest (an inner one may disable autocast or change the dtype; the outer "
     .. "state comes back after it) and compose with lm.no_grad. A parameter (a leaf float32 "
     .. "tensor that requires grad) is cast once per region and the cast reused; the cache "
     .. "empties when the outermost region exits. Only float32 and the other half type are "
     .. "cast; float64 stays float64." })
E("lm.is_autocast_enabled", "lm.is_autocast_enabled(device) -> boolean", "Whether autocast is "
   .. "on for the device type (\"cpu\" or \"cuda\"; default: the default device's).")
E("lm.get_autocast_dtype", "lm.get_autocast_dtype(device) -> dtype", "The low-precision dtype "
   .. "of the device type's innermost region (outside one: bfloat16 on \"cpu\", float16 on "
   .. "\"cuda\").")
E("lm.amp", "lm.amp", "Mixed-precision training helpers: lm.amp.GradScaler.")
E("lm.amp.GradScaler", "lm.amp.GradScaler(opts) -> scaler", "Loss scaling for float16 "
   .. "training: scaler:scale(loss):backward(); scaler:step(opt); scaler:update().",
   { opts = "{init_scale = 65536, growth_factor = 2, backoff_factor = 0.5, growth_interval = "
     .. "2000, enabled = true, device = \"cpu\"}",
     err = "an unknown option, init_scale not positive and finite, growth_factor <= 1, "
     .. "backoff_factor outside (0, 1), growth_interval not a positive integer: "
     .. "`lumen.GradScaler: <problem>`",
     note = "disabled (enabled = false), scale returns its argument, step calls opt:step() and "
     .. "update does nothing" })
E("GradScaler:scale", "scaler:scale(outputs) -> Tensor or array", "outputs * the scale "
   .. "(differentiable); an array of tensors gives an array.",
   { err = "outputs neither a tensor nor an array of tensors" })
E("GradScaler:unscale_", "scaler:unscale_(opt)", "Divide the gradients of opt's parameters by "
   .. "the scale in place and record whether one holds an inf or a NaN (for clipping "
   .. "gradients before step).",
   { err = "a second call before update(), a call after step(), no scale() before, float16 "
     .. "gradients" })
E("GradScaler:step", "scaler:step(opt, ...) -> opt:step's result or nil", "Unscale (unless "
   .. "unscale_ ran), then opt:step(...) unless a gradient holds an inf or a NaN (skipped: "
   .. "nil).", { err = "a second step() before update(), no scale() before, a closure" })
E("GradScaler:update", "scaler:update(new_scale)", "Multiply the scale by backoff_factor when "
   .. "a step found an inf or NaN, by growth_factor after growth_interval clean steps in a row "
   .. "(not past float32's range); new_scale (a number or 1-element tensor) sets it instead.",
   { err = "no step() / unscale_() since the last update, a non-positive new_scale" })
E("GradScaler:get_scale", "scaler:get_scale() -> number", "The current scale (init_scale "
   .. "before the first scale(); 1 when disabled).")
E("GradScaler:is_enabled", "scaler:is_enabled() -> boolean", "The enabled option.")
E("GradScaler:get_growth_factor", "scaler:get_growth_factor() -> number", "growth_factor.")
E("GradScaler:set_growth_factor", "scaler:set_growth_factor(x)", "Set growth_factor (> 1).")
E("GradScaler:get_backoff_factor", "scaler:get_backoff_factor() -> number", "backoff_factor.")
E("GradScaler:set_backoff_factor", "scaler:set_backoff_factor(x)", "Set backoff_factor (in "
   .. "(0, 1)).")
E("GradScaler:get_growth_interval", "scaler:get_growth_interval() -> integer",
  "growth_interval.")
E("GradScaler:set_growth_interval", "scaler:set_growth_interval(n)", "Set growth_interval (a "
   .. "positive integer).")
E("GradScaler:state_dict", "scaler:state_dict() -> table", "PyTorch's keys: {scale, "
   .. "growth_factor, backoff_factor, growth_interval, _growth_tracker} ({} when disabled); "
   .. "plain numbers, so it fits a checkpoint's fields.")
E("GradScaler:load_state_dict", "scaler:load_state_dict(sd)", "Restore a state_dict.",
   { err = "an empty table (saved from a disabled scaler), missing or invalid values" })

S("layout_tools", "Memory-format tools: lm.layout", [[
Convert a model to channels-last and check, debug and survey how formats propagate
(docs/checking_models.md, docs/debugging_channels_last.md, docs/operator_coverage.md).]])
E("lm.layout", "lm.layout", "check, trace, coverage, to_channels_last and the format "
   .. "predicates.")
E("lm.to_channels_last", "lm.to_channels_last(model) -> model", "In place: every 4-D "
   .. "parameter and buffer (and gradient) to channels_last, every 5-D one to channels_last_3d "
   .. "(1x1 and depthwise weights tagged with the format's strides), the same parameter objects; "
   .. "a tensor argument returns the tensor in its rank's format.",
   { err = "a tensor of another rank than 4 or 5 raises the rank error (\"required rank 4 "
   .. "tensor\")" })
E("lm.layout.to_channels_last", "lm.layout.to_channels_last(model) -> model", "Same as "
   .. "lm.to_channels_last.")
E("lm.layout.format", "lm.layout.format(t) -> string", "\"channels_last\", "
   .. "\"channels_last_3d\", \"contiguous\", \"ambiguous\", \"nlc\" (a 3-D N,C,L tensor with "
   .. "N,L,C strides) or another description of t's layout, for reports.")
E("lm.layout.is_channels_last", "lm.layout.is_channels_last(t) -> boolean", "4-D, "
   .. "channels-last contiguous and not contiguous (the unambiguous predicate).")
E("lm.layout.is_channels_last_3d", "lm.layout.is_channels_last_3d(t) -> boolean", "5-D, "
   .. "channels_last_3d contiguous and not contiguous.")
E("lm.layout.check", "lm.layout.check(model, input, opts) -> report", "One forward (and "
   .. "backward) with every module's forward wrapped and every operator traced. report.ok is "
   .. "false when channels-last (channels_last_3d for 5-D) is lost anywhere: at a leaf's output, "
   .. "inside a leaf's forward (a functional call, even when the output is channels-last "
   .. "again), in a container's own forward (an x:contiguous() between two children: a row of "
   .. "that container, own_code = true), at a module's input (code the trace cannot see), at "
   .. "the model's output, in a gradient arriving at a module's output or at the input, or in "
   .. "a parameter gradient. report.first_lost names the module (\"(model)\" for the model's "
   .. "own forward), with first_lost_format, first_lost_where (\"output\", \"inside\", "
   .. "\"input\") and first_lost_op (the operator); report.rows has one row per leaf call "
   .. "({path, type, call, input_format, output_format, grad_format, lost, lost_ops, ...}), a "
   .. "row marked fused_into for a ReLU fused into its batch norm (nn.utils.bn_relu), and one "
   .. "marked not_called for a module never called. tostring(report), the rows and "
   .. "report:to_html() give the same verdict. Other ranks (the 1-D operators' N,C,L) are "
   .. "shown, never judged. A channels-to-last view keeps the layout: x:permute(1, 3, 4, 2) "
   .. "of a channels-last N x C x H x W tensor is its contiguous N x H x W x C view (no copy; "
   .. "5-D likewise), and a leaf's contiguous output computed from such a view keeping N, H, W "
   .. "(LayerNorm, Linear, GELU over the last dim) is too: those rows have nhwc = true, their "
   .. "output gradient must be contiguous, and the permute is no loss inside a forward "
   .. "(ConvNeXt's Permute and LayerNorm2d).",
   { opts = "{backward = true, loss = fn(output) -> scalar (default output:sum()), trace = "
   .. "false (true keeps lm.layout.trace's report as report.trace), html = path (also writes "
   .. "the report as a self-contained HTML page, as report:to_html(path))}; input: a tensor or "
   .. "an array of arguments", note = "everything is restored afterwards: forwards, .grad, "
   .. "batch-norm running statistics; docs/checking_models.md", err = "an unknown option "
   .. "(`lumen.layout.check: unknown option 'x'`), an html path that cannot be written" })
E("report:to_html", "report:to_html(path) -> true / report:to_html() -> string", "The "
   .. "lm.layout.check report as one self-contained HTML page (inline CSS, no scripts): the "
   .. "module tree coloured by each module's output format (channels-last, contiguous, mixed, "
   .. "none), the module that loses channels-last and its operator highlighted "
   .. "(docs/checking_models.md).", { err = "a path that cannot be written" })
E("lm.layout.trace", "lm.layout.trace(fn, opts) -> report, fn's results", "Run fn() with every "
   .. "operator wrapped and record each call that receives a channels-last tensor and returns "
   .. "a 4-D tensor that is not, or a channels_last_3d tensor and returns a 5-D tensor that is "
   .. "not (report.lost, report.first, report.message; entry.format says which).",
   { opts = "{raise = false, on_lost = nil}: raise = true raises at the first loss "
   .. "(\"Operator `X` lost channels_last property\", or channels_last_3d); on_lost(entry) is "
   .. "called with each loss as it is recorded" })
E("lm.layout.coverage", "lm.layout.coverage(opts) -> report", "Run every operator on NCHW and "
   .. "NHWC input (the 3-D ones on NCDHW and NDHWC, the 1-D ones on N,C,L contiguous and N,L,C "
   .. "strides) and report the result formats, whether channels-last is kept, which formats "
   .. "run natively, and the gradient format; tostring prints one table per group.",
   { opts = "{shape = {2, 32, 96, 96}, shape3d = {2, 32, 8, 24, 24}, shape1d = {8, 32, 1024}, "
   .. "backward = true, only = {op names}}" })
E("lm.layout.operators", "lm.layout.operators() -> array of {op, kind, group}", "The operator "
   .. "list coverage runs (group: \"2-D\", \"3-D\" or \"1-D\").")

S("data", "lm.data", [[
Data sets and the batch loader. The loader's worker threads (C) gather or decode samples,
augment, normalise and write straight into channels-last float32 batches while Lua trains on the
previous one; batches are the same whatever the number of workers (docs/training.md).]])
E("lm.data", "lm.data", "read_idx, fashion_mnist, ImageFolder, DataLoader, image decoding.")
E("lm.data.read_idx", "lm.data.read_idx(path) -> Tensor", "An IDX file (MNIST format, .gz or "
   .. "plain) as a contiguous tensor (uint8, int32, float32 or float64 as stored).",
   { err = "missing or malformed file" })
E("lm.data.fashion_mnist", "lm.data.fashion_mnist(split, root) -> dataset {images, labels}",
   "Fashion-MNIST (or MNIST: same file names): a TensorDataset with images uint8 (N,28,28), "
   .. "labels int64 (N), 1-based (1..10), root, split and classes; ds:len() is N and "
   .. "tostring(ds) a summary.", { opts = "split = \"train\" | \"test\"; root = "
   .. "lm.data.FASHION_MNIST_ROOT", err = "an unknown split, missing files" })
E("lm.data.TensorDataset", "lm.data.TensorDataset(images, labels, info) -> dataset", "A data "
   .. "set held in tensors, {images = uint8 (N,H,W[,C]), labels = int64 (N) or nil}: ds:len() "
   .. "(ds:size(), Torch7's name) is N, tostring(ds) prints its name, root, samples, classes, "
   .. "sizes and dtypes. A DataLoader takes it as a plain {images =, labels =} table. #ds is "
   .. "not the length: LuaJIT ignores __len on tables.", { opts = "info = {name =, split =, "
   .. "root =, classes =}", err = "images that are not a tensor, labels that are not 1-D with "
   .. "one per image" })
E("lm.data.FASHION_MNIST_ROOT", "lm.data.FASHION_MNIST_ROOT", "Where Debian's "
   .. "dataset-fashion-mnist puts the files.")
E("lm.data.FASHION_MNIST_CLASSES", "lm.data.FASHION_MNIST_CLASSES", "The ten class names, "
   .. "in label order.")
E("lm.data.IMAGENET_MEAN", "lm.data.IMAGENET_MEAN", "{0.485, 0.456, 0.406}: torchvision's "
   .. "normalisation mean.")
E("lm.data.IMAGENET_STD", "lm.data.IMAGENET_STD", "{0.229, 0.224, 0.225}.")
E("lm.data.image_support", "lm.data.image_support() -> {jpeg, png}", "Which decoders this "
   .. "build has.")
E("lm.data.read_image", "lm.data.read_image(path) -> Tensor", "Decode a JPEG or PNG (by "
   .. "content) into uint8 (H, W, 3) RGB (gray replicated, alpha dropped, CMYK converted).",
   { err = "not a string, unreadable, truncated (a JPEG without its end marker included) or "
   .. "corrupt file, not a regular file (a FIFO), an image of more than 178956970 pixels (PIL's "
   .. "decompression-bomb limit; LUMEN_MAX_IMAGE_PIXELS raises it), a format this build cannot "
   .. "decode" })
E("lm.data.load_image", "lm.data.load_image(path, opts) -> Tensor", "One image decoded and "
   .. "resampled as an ImageFolder sample: float32 (1, 3, h, w).",
   { opts = "the ImageFolder image options (size, crop, resize, scale, ratio, draft), mean, "
   .. "std, hflip = false, seed = 0, memory_format = lm.channels_last",
   fmt = "channels-last unless opts.memory_format = lm.contiguous_format" })
E("lm.data.ImageFolder", "lm.data.ImageFolder(root, opts) -> dataset", "root/<class>/**.{jpg,"
   .. "jpeg,png}: one sub-folder per class (sorted names -> labels 1..C); nothing is decoded "
   .. "until a DataLoader runs. Fields root, classes, class_to_idx, paths, labels (int64), "
   .. "image_size = {h, w}; ds:len() (ds:size()) is the number of images, tostring(ds) a "
   .. "summary (root, samples, classes, transforms); ds:read(i) (uint8 (H, W, 3)) and "
   .. "ds:load(i, opts) (the sample as the loader makes it, and its label).",
   { opts = "{size = 224 (number or {h, w}), crop = \"none\" | \"center\" | \"random\" "
   .. "(RandomResizedCrop), resize (for center), scale = {0.08, 1}, ratio = {3/4, 4/3}, "
   .. "draft = true, classes (list), extensions = {\"jpg\", \"jpeg\", \"png\"}, "
   .. "skip_corrupt = false (true: a DataLoader leaves out an image it cannot decode, with "
   .. "one warning per file on stderr, instead of raising; the batch is smaller)}",
   err = "root missing, no class folders, no images, bad option values, an unknown option; "
   .. "a corrupt image raises in the DataLoader, naming the file, unless skip_corrupt" })
E("lm.data.is_image_folder", "lm.data.is_image_folder(x) -> boolean", "true for ImageFolder "
   .. "data sets.")
E("lm.data.DataLoader", "lm.data.DataLoader(dataset, opts) -> loader", "Batches of float32 "
   .. "(B, C, H, W) with int64 labels from {images = uint8 (N,H,W[,C]), labels = int64 (N)} "
   .. "or an ImageFolder. `for x, y, i in loader:iter(epoch, start_batch) do ... end`; "
   .. "loader:len() (loader:num_batches()) gives the batches per epoch, tostring(loader) a "
   .. "summary (samples, batches, order, output format, transforms).",
   { opts = "{batch_size = 64, shuffle = true, seed = 0, drop_last = false, workers = 2, "
   .. "prefetch = max(2, workers), memory_format = lm.channels_last, hflip = false, mean = 0, "
   .. "std = 1 (per channel, [0,1] scale); tensor data sets also pad = 0, crop}",
   fmt = "batches are channels-last unless memory_format = lm.contiguous_format",
   err = "a data set of the wrong shape or dtype, bad option values",
   note = "opts.sampler = a DistributedSampler: the loader goes over that rank's share "
   .. "(iter(epoch) calls sampler:set_epoch(epoch)); the augmentations differ by rank" })
E("lm.data.DistributedSampler", "lm.data.DistributedSampler(n | dataset, opts) -> sampler",
   "Each rank's share of the samples (PyTorch's DistributedSampler): every epoch one order of "
   .. "1..n, the same on every rank (the permutation a DataLoader with the same seed shuffles "
   .. "with; 1..n without shuffle), padded by repeating its start to a multiple of "
   .. "num_replicas (or cut, with drop_last); rank r takes every num_replicas-th position from "
   .. "r + 1. sampler:set_epoch(e) reshuffles, sampler:indices() lists the rank's samples "
   .. "(1-based); fields num_samples (per rank), total_size.",
   { opts = "{num_replicas = lm.distributed.world_size(), rank = lm.distributed.rank(), "
     .. "shuffle = true, seed = 0, drop_last = false}",
     err = "rank outside 0..num_replicas-1, num_replicas < 1, no num_replicas / rank before "
     .. "lm.distributed.init, an unknown option" })
E("lm.data.is_distributed_sampler", "lm.data.is_distributed_sampler(x) -> boolean", "true for "
   .. "DistributedSampler objects.")

-- issue 40 (wt-act): lm.ops ------------------------------------------------------------------
S("ops", "lm.ops", [[
torchvision.ops' operators that the model definitions use (loaded on first use of lm.ops).]])
E("lm.ops", "lm.ops", "torchvision.ops' operators (lua/lumen/ops.lua).")
E("lm.ops.stochastic_depth", "lm.ops.stochastic_depth(x, p, mode, training) -> Tensor",
   "torchvision.ops.stochastic_depth: while training (default true), mode \"row\" (the default) "
   .. "zeroes each sample with probability p, \"batch\" the whole input, and what survives is "
   .. "scaled by 1/(1-p); the identity when not training or p is 0.", { fmt = FMT_EW,
   err = "p outside [0, 1], an unknown mode, a non-floating input" })
E("lm.ops.StochasticDepth", "lm.ops.StochasticDepth(p, mode)", "stochastic_depth as a module "
   .. "(active while training).", { err = "p outside [0, 1], an unknown mode" })
-- end of issue 40 (wt-act) -------------------------------------------------------------------

S("models", "lm.models", [[
torchvision's architectures with torchvision's state_dict keys, so torchvision weights load
unchanged. Each constructor takes `{num_classes = 1000}` (the video models: 400).]])
E("lm.models", "lm.models", "Model constructors (models/*.lua).")
for _, n in ipairs({ "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                     "resnext50_32x4d", "resnext101_32x8d", "wide_resnet50_2",
                     "wide_resnet101_2" }) do
   E("lm.models." .. n, "lm.models." .. n .. "(opts) -> model", "torchvision's " .. n .. ".",
      { opts = "{num_classes = 1000}", err = "num_classes not a positive integer, opts not a "
      .. "table" })
end
E("lm.models.alexnet", "lm.models.alexnet(opts) -> model", "torchvision's AlexNet.",
   { opts = "{num_classes = 1000, dropout = 0.5}" })
E("lm.models.small_resnet", "lm.models.small_resnet(opts) -> model", "A small ResNet for 28x28 "
   .. "single-channel images (Fashion-MNIST): 3x3 stem, three stages of BasicBlocks, global "
   .. "pooling, linear.", { opts = "{num_classes = 10, width = 16, blocks = 1, in_channels = 1}" })
E("lm.models.ResNet", "lm.models.ResNet(block, layers, opts) -> model", "The ResNet builder: "
   .. "block is \"BasicBlock\", \"Bottleneck\" or a class; layers the blocks per stage.",
   { opts = "{num_classes = 1000, groups = 1, width_per_group = 64}" })
E("lm.models.BasicBlock", "lm.models.BasicBlock(...) -> module", "torchvision's BasicBlock.")
E("lm.models.Bottleneck", "lm.models.Bottleneck(...) -> module", "torchvision's Bottleneck.")
for _, v in ipairs({
   { "r3d_18", "3x3x3 convolutions throughout (BasicStem: 3x7x7, stride (1, 2, 2))" },
   { "mc3_18", "3x3x3 convolutions in the first stage, 1x3x3 (no temporal) after" },
   { "r2plus1d_18", "every 3x3x3 convolution factorised into 1x3x3, batch norm, ReLU, 3x1x1 "
     .. "(Conv2Plus1D; R2Plus1dStem)" } }) do
   E("lm.models." .. v[1], "lm.models." .. v[1] .. "(opts) -> model", "torchvision's video "
      .. "ResNet " .. v[1] .. " (torchvision.models.video) for clips N x 3 x T x H x W: " .. v[2]
      .. "; BasicBlocks {2, 2, 2, 2}, global average pooling, fc. Same state_dict keys as "
      .. "torchvision's; nn.fold_batch_norm folds every BatchNorm3d and runs the ReLUs and "
      .. "residual adds in the convolutions' epilogues (models/video_resnet.lua).",
      { opts = "{num_classes = 400, zero_init_residual = false (accepted as torchvision "
        .. "accepts it; it only touches Bottleneck blocks, which these models do not have)}",
        fmt = "lm.to_channels_last(model) puts the 5-D weights in channels_last_3d; a "
        .. "channels_last_3d clip then runs channels_last_3d end to end, gradients included",
        err = "num_classes not a positive integer, zero_init_residual not a boolean, opts not a "
        .. "table, an unknown option" })
end

-- issue 40: the model families (models/mobilenet.lua, efficientnet.lua, convnext.lua, regnet.lua,
-- shufflenet.lua) ----------------------------------------------------------------------------
local FAMILY_FMT = "lm.to_channels_last(model) and a channels-last input: every activation, 4-D "
   .. "weight and gradient stays channels-last (lm.layout.check clean, forward and backward; "
   .. "docs/model_families.md)"
local FAMILY_ERR = "num_classes not a positive integer, a bad option value, opts not a table, "
   .. "an unknown option"
E("lm.models.mobilenet_v2", "lm.models.mobilenet_v2(opts) -> model", "torchvision's MobileNet "
   .. "V2 (inverted residuals, ReLU6) with its state_dict keys; every Conv2dNormActivation is a "
   .. "Sequential (Conv2d, BatchNorm2d, ReLU6) that nn.fold_batch_norm folds "
   .. "(models/mobilenet.lua).", { opts = "{num_classes = 1000, width_mult = 1.0, "
   .. "round_nearest = 8, dropout = 0.2, inverted_residual_setting = {{t, c, n, s}, ...}}",
   fmt = FAMILY_FMT, err = FAMILY_ERR })
for _, n in ipairs({ "mobilenet_v3_large", "mobilenet_v3_small" }) do
   E("lm.models." .. n, "lm.models." .. n .. "(opts) -> model", "torchvision's " .. n
      .. " (Hardswish, squeeze-and-excitation with Hardsigmoid, batch norm eps 1e-3) with its "
      .. "state_dict keys (models/mobilenet.lua).", { opts = "{num_classes = 1000, "
      .. "width_mult = 1.0, dropout = 0.2, reduced_tail = false, dilated = false}",
      fmt = FAMILY_FMT, err = FAMILY_ERR })
end
for _, n in ipairs({ "b0", "b1", "b2", "b3" }) do
   E("lm.models.efficientnet_" .. n, "lm.models.efficientnet_" .. n .. "(opts) -> model",
      "torchvision's EfficientNet-" .. n:upper() .. " (MBConv with squeeze-and-excitation, "
      .. "SiLU, stochastic depth growing linearly to stochastic_depth_prob); b0-b3 from one "
      .. "definition (width and depth multipliers as torchvision's) with its state_dict keys "
      .. "(models/efficientnet.lua).", { opts = "{num_classes = 1000, dropout = 0.2 (b2, b3: "
      .. "0.3), stochastic_depth_prob = 0.2}", fmt = FAMILY_FMT, err = FAMILY_ERR })
end
for _, v in ipairs({ { "tiny", 0.1 }, { "small", 0.4 }, { "base", 0.5 } }) do
   E("lm.models.convnext_" .. v[1], "lm.models.convnext_" .. v[1] .. "(opts) -> model",
      "torchvision's ConvNeXt-" .. v[1] .. " (7x7 depthwise, LayerNorm, GELU MLP, layer scale, "
      .. "stochastic depth; LayerNorm2d as permute + layer_norm + permute, which on a "
      .. "channels-last tensor is a view, no copy) with its state_dict keys "
      .. "(models/convnext.lua).", { opts = "{num_classes = 1000, stochastic_depth_prob = "
      .. v[2] .. ", layer_scale = 1e-6}", fmt = FAMILY_FMT, err = FAMILY_ERR })
end
local NC_ERR = "num_classes not a positive integer, opts not a table, an unknown option"
for _, v in ipairs({ "y_400mf", "y_800mf", "y_1_6gf", "y_3_2gf", "y_8gf", "y_16gf", "y_32gf",
                     "y_128gf", "x_400mf", "x_800mf", "x_1_6gf", "x_3_2gf", "x_8gf", "x_16gf",
                     "x_32gf" }) do
   local y = v:sub(1, 1) == "y"
   E("lm.models.regnet_" .. v, "lm.models.regnet_" .. v .. "(opts) -> model",
      "torchvision's RegNet" .. v:upper() .. " (residual bottlenecks: 1x1, grouped 3x3, "
      .. (y and "squeeze-and-excitation, " or "") .. "1x1; widths, depths and group widths "
      .. "from torchvision's BlockParams.from_init_params) with its state_dict keys; the whole "
      .. "family from one definition (models/regnet.lua).", { opts = "{num_classes = 1000}",
      fmt = FAMILY_FMT, err = NC_ERR })
end
for _, v in ipairs({ "x0_5", "x1_0", "x1_5", "x2_0" }) do
   E("lm.models.shufflenet_v2_" .. v, "lm.models.shufflenet_v2_" .. v .. "(opts) -> model",
      "torchvision's ShuffleNet V2 " .. v:gsub("_", ".") .. " (channel split as views, "
      .. "branches of 1x1 and depthwise 3x3 convolutions, concatenation, "
      .. "F.channel_shuffle(x, 2), which keeps channels-last) with its state_dict keys "
      .. "(models/shufflenet.lua).", { opts = "{num_classes = 1000}", fmt = FAMILY_FMT,
      err = NC_ERR })
end

S("serialization", "Serialization and checkpoints", [[
Files are safetensors: files from other safetensors writers load, files written here load
there, and lumen restores each tensor's memory format (recorded in the metadata). Saving goes
to a temporary file that is fsync'd and renamed: a failure never leaves a half-written file.]])
E("lm.save", "lm.save(tensors, path, metadata)", "Write a table name -> tensor to path "
   .. "(safetensors); metadata: an optional table string -> string.",
   { fmt = "values are written in logical order; channels-last tensors are recorded as such "
   .. "and come back channels-last", err = "non-tensor values, non-string names or metadata, "
   .. "an unwritable path (the previous file is left intact)",
   note = "written to <path>.tmp.<pid>.<n>.<n> and renamed; temporary files of the same path "
   .. "left by a writer that died (its pid gone, unmodified for lm.serialize.STALE_TMP_AGE "
   .. "seconds) are removed first (docs/file_formats.md)" })
E("lm.load", "lm.load(path) -> table name -> tensor, metadata", "Read a safetensors file; "
   .. "contiguous aligned tensors are views of the mapped file (no copy).",
   { fmt = "each tensor gets back the memory format it was saved with",
   err = "a file that is not safetensors (`lumen.load: 'x.pt' is not a safetensors file (...; "
   .. "this is a zip archive, as PyTorch's torch.save writes .pt/.pth files ...)`: zip, pickle, "
   .. "images, ONNX and text are named); a missing, truncated, corrupt or hostile file: "
   .. "`lumen.load: ...` (never a read past the end)" })
E("lm.serialize", "lm.serialize", "The module behind lm.save / lm.load (lm.serialize.save, "
   .. "lm.serialize.load).")
E("lm.serialize.save", "lm.serialize.save(tensors, path, metadata)", "Same as lm.save.")
E("lm.serialize.load", "lm.serialize.load(path)", "Same as lm.load.")
E("lm.serialize.STALE_TMP_AGE", "lm.serialize.STALE_TMP_AGE = 60", "Seconds a dead writer's "
   .. "temporary file must be left unmodified before lm.save removes it (a writer in another "
   .. "container sharing the folder looks dead from here; the age protects it).")
E("lm.save_checkpoint", "lm.save_checkpoint(path, state)", "Save a model's state, an "
   .. "optimizer's state and any user fields (numbers, strings, nested tables, tensors) in one "
   .. "safetensors file, atomically; the RNG state is saved too, and a CRC-32 of the tensors "
   .. "and fields (load_checkpoint refuses a file damaged after it was written).",
   { opts = "state.model: a Module or a state_dict; state.optimizer: an optimizer or its "
   .. "state_dict; other fields: user fields", err = "values that cannot be stored (functions, "
   .. "userdata), an unwritable path" })
E("lm.load_checkpoint", "lm.load_checkpoint(path, opts) -> fields", "Read a checkpoint: the "
   .. "user fields, plus .model (the state table), .optimizer (its state_dict or nil) and "
   .. ".rng_state.", { opts = "{model = m, optimizer = o, strict = true, rng = false}: given "
   .. "model/optimizer are loaded; rng = true restores the random generator",
   err = "a missing or corrupt file (`'<path>' is damaged: its checksum ... is not the one it "
   .. "was saved with`), a state that does not fit the model (strict)" })
E("lm.checkpoint", "lm.checkpoint", "The module behind lm.save_checkpoint / "
   .. "lm.load_checkpoint.")
E("lm.checkpoint.save_checkpoint", "lm.checkpoint.save_checkpoint(path, state)", "Same as "
   .. "lm.save_checkpoint.")
E("lm.checkpoint.load_checkpoint", "lm.checkpoint.load_checkpoint(path, opts)", "Same as "
   .. "lm.load_checkpoint.")

S("jit", "Shipping models: lm.jit, lm.onnx", [[
`lm.jit.trace(model, x)` records the operators one forward runs (the F.* functions, the Tensor
methods, lm.*'s operators; the outermost call only) into a graph; the traced module `g` runs them
again on the model's own tensors: `g(x)`, autograd works through it. `tostring(g)` prints one line
per node with the sizes, dtype and memory format of its values; `g:save(path)` writes one
safetensors file (the weights by state_dict name, the graph as versioned JSON in the metadata);
`lm.jit.load(path)` needs no model source; `lm.jit.freeze(g)` is the inference pipeline.
`g:count(op)`, `g:named_tensors()`, `g:parameters()`, `g:state_dict()` inspect it.
`lm.onnx.export` writes ONNX. Guide: docs/shipping_models.md.]])
E("lm.jit", "lm.jit", "Tracing, saving, loading and freezing models (lua/lumen/jit/: "
   .. "recorder, graph, serialize, freeze).", { note = "loaded on first use" })
E("lm.jit.trace", "lm.jit.trace(model, input, {warn = fn}) -> g", "Record one forward of "
   .. "model (an nn.Module, a traced module or a function) on input (a tensor or an array of "
   .. "tensors) into a callable traced module.",
   { fmt = "every value's memory format is recorded; g runs the same operators, so the same "
   .. "formats come out", err = "a model that is not a Module or function, an input that is "
   .. "not a tensor, an operator argument that cannot be recorded (a function, a module), a "
   .. "forward that returns no tensor: `lumen.jit.trace: ...`",
   note = "control flow that depends on tensor values is not recorded (as torch.jit.trace): "
   .. "the trace warns (stderr, or opts.warn(msg)) when the forward reads Tensor:item() or "
   .. "totable(); trace after model:eval() to trace inference" })
E("lm.jit.load", "lm.jit.load(path) -> g", "Load a traced module written by g:save(path), "
   .. "without the model's source; weights go to the device they were traced on.",
   { fmt = "weights come back in the memory format they were saved with",
   err = "a missing, truncated or non-jit file, a newer graph format version, a checksum "
   .. "mismatch (the file was changed), a damaged graph, an unknown operator, a graph/weight "
   .. "mismatch: `lumen.jit.load: '<path>': ...`, never a crash" })
E("lm.jit.freeze", "lm.jit.freeze(g) -> g2", "An inference graph: dropout removed, batch norms "
   .. "folded into the convolutions before them, conv + bias (+ residual add) + activation "
   .. "(relu, relu6, silu, hardswish, hardsigmoid, sigmoid, gelu) fused into F.conv2d's "
   .. "epilogue, dead nodes removed; g is left as it is.",
   { fmt = "channels-last is propagated: 4-D convolution weights are stored channels-last, "
   .. "the layout conversions between 4-D values are removed, one conversion stands at each "
   .. "4-D input (to channels-last) and output (back to the traced format); a graph that "
   .. "views a 4-D value keeps its layouts",
   err = "a graph traced in training mode (a batch norm or dropout in training mode)",
   note = "g2.freeze_stats counts what each pass did; the frozen weights do not require grad" })
E("lm.jit.is_traced", "lm.jit.is_traced(x) -> boolean", "true for a traced module.")
E("lm.onnx", "lm.onnx", "ONNX export (lua/lumen/onnx.lua; the writer build/liblumen_onnx.so is "
   .. "built by make when protoc-c and libprotobuf-c-dev are installed).",
   { note = "loaded on first use; the writer library only when export runs" })
E("lm.onnx.export", "lm.onnx.export(model, input, path, {opset = 17, dynamic_axes = "
   .. "{input = {[1] = \"batch\"}, output = {[1] = \"batch\"}}}) -> path", "Write an ONNX "
   .. "model of the traced graph (model is traced with input, or a traced module is taken as "
   .. "it is) that ONNX Runtime runs with the same results. dynamic_axes (PyTorch's option, "
   .. "dims 1-based) makes those dims of the inputs and outputs symbolic; with a dynamic batch "
   .. "the model runs at any batch size. The operators and their ONNX forms: "
   .. "docs/shipping_models.md.",
   { fmt = "ONNX is NCHW: channels-last values are exported with their logical sizes and "
   .. "weights in logical order", err = "an operator without an ONNX form, a model in training "
   .. "mode (a batch norm, dropout or StochasticDepth), an opset outside 13-21, dynamic_axes "
   .. "naming no input or output, a dim past its rank or a name that is not a string, the "
   .. "writer not built: `lumen.onnx.export: ...` "
   .. "(nothing is written)", note = "inputs are named input (input.1, ...), outputs output, "
   .. "weights by their state_dict names" })
E("lm.onnx.available", "lm.onnx.available() -> boolean", "Whether the ONNX writer library "
   .. "can be loaded.")
E("lm.onnx.DEFAULT_OPSET", "lm.onnx.DEFAULT_OPSET = 17", "The opset export writes by default.")
E("lm.onnx.MIN_OPSET", "lm.onnx.MIN_OPSET = 13", "The lowest opset export writes.")
E("lm.onnx.MAX_OPSET", "lm.onnx.MAX_OPSET = 21", "The highest opset export writes.")

S("memory", "lm.memory", [[
How tensor memory is owned and freed: tensors are released by Lua's collector, which the
allocator triggers by count, by a soft limit on live bytes, and optionally by traffic and
cache-miss triggers (docs/memory.md). Sizes are in bytes.]])
E("lm.memory", "lm.memory", "Allocator statistics and the collection triggers.")
E("lm.memory.collect", "lm.memory.collect()", "Run a full collection now (frees dead tensors).")
E("lm.memory.check_pressure", "lm.memory.check_pressure()", "Collect if the allocator asks for "
   .. "it (the check every constructor does).")
E("lm.memory.live_bytes", "lm.memory.live_bytes() -> number", "Bytes held by live tensors.")
E("lm.memory.peak_bytes", "lm.memory.peak_bytes() -> number", "The highest live_bytes since "
   .. "the start or reset_peak.")
E("lm.memory.reset_peak", "lm.memory.reset_peak()", "Restart the peak at the current live "
   .. "bytes.")
E("lm.memory.cached_bytes", "lm.memory.cached_bytes() -> number", "Freed blocks kept for reuse.")
E("lm.memory.empty_cache", "lm.memory.empty_cache()", "Return cached blocks to the system.")
E("lm.memory.alloc_count", "lm.memory.alloc_count() -> number", "Allocations so far.")
E("lm.memory.owned_count", "lm.memory.owned_count() -> number", "Tensors currently owned "
   .. "(slots in use).")
E("lm.memory.slot_capacity", "lm.memory.slot_capacity() -> number", "The slot tables' "
   .. "capacity (shrinks back after a peak).")
E("lm.memory.soft_limit", "lm.memory.soft_limit() -> number", "The live-bytes growth that "
   .. "triggers a collection (default 96 MiB; LUMEN_SOFT_LIMIT).")
E("lm.memory.set_soft_limit", "lm.memory.set_soft_limit(bytes)", "Change the soft limit.",
   { err = "not a non-negative number" })
E("lm.memory.DEFAULT_SOFT_LIMIT", "lm.memory.DEFAULT_SOFT_LIMIT", "96 MiB.")
E("lm.memory.traffic_limit", "lm.memory.traffic_limit() -> number", "The traffic trigger's "
   .. "growth in bytes (0: off, the default).")
E("lm.memory.set_traffic_limit", "lm.memory.set_traffic_limit(bytes | \"auto\")", "Fix the "
   .. "traffic limit, 0 turns it off, \"auto\" adapts it to the cost of a collection "
   .. "(LUMEN_TRAFFIC_LIMIT).", { err = "neither a non-negative number nor \"auto\"" })
E("lm.memory.traffic_adaptive", "lm.memory.traffic_adaptive() -> boolean", "true while the "
   .. "traffic limit is \"auto\".")
E("lm.memory.TRAFFIC_COST_RATIO", "lm.memory.TRAFFIC_COST_RATIO", "\"auto\": the growth whose "
   .. "DRAM round trip costs this many times a collection.")
E("lm.memory.DRAM_BYTES_PER_SECOND", "lm.memory.DRAM_BYTES_PER_SECOND", "The bandwidth the "
   .. "\"auto\" traffic limit assumes.")
E("lm.memory.BASE_TRAFFIC_LIMIT", "lm.memory.BASE_TRAFFIC_LIMIT", "The smallest \"auto\" "
   .. "limit: max(4 MiB, half the cache).")
E("lm.memory.MAX_TRAFFIC_LIMIT", "lm.memory.MAX_TRAFFIC_LIMIT", "Above this \"auto\" growth "
   .. "the trigger rests.")
E("lm.memory.miss_block", "lm.memory.miss_block() -> number", "The miss trigger's smallest "
   .. "block (2 MiB; 0: off; LUMEN_MISS_BLOCK).")
E("lm.memory.set_miss_block", "lm.memory.set_miss_block(bytes)", "Change the miss block (0 "
   .. "turns the trigger off).")
E("lm.memory.miss_floor", "lm.memory.miss_floor() -> number", "The growth a miss needs now "
   .. "(doubles after a collection that found little dead).")
E("lm.memory.SETTLE_POOL", "lm.memory.SETTLE_POOL", "true (default): collect at the end of "
   .. "a backward pass that took fresh blocks of 2 MiB or more from the system, so that the "
   .. "next training step finds its blocks in the cache.")
E("lm.memory.settle_pool", "lm.memory.settle_pool()", "Collect now if the allocator took fresh "
   .. "blocks of 2 MiB or more since the last call (what backward does as it ends).")
E("lm.memory.cache_size", "lm.memory.cache_size() -> number", "The reported last-level cache.")
E("lm.memory.cache_share", "lm.memory.cache_share() -> number", "The cache one process counts "
   .. "on: cache_size() capped at 32 MiB (LUMEN_CACHE_SHARE).")
E("lm.memory.cold_bytes", "lm.memory.cold_bytes() -> number", "The coldness threshold: a "
   .. "result this large is written cold (half the cache; LUMEN_COLD_BYTES).")
E("lm.memory.count_base", "lm.memory.count_base() -> number", "Tensors made between "
   .. "collections before the count trigger fires (diagnostics).")

S("repl", "The lumen command and REPL", [[
`bin/lumen FILE.lua args...` runs a script with `arg` set; `bin/lumen -e STMT`, `-l MOD`, `-i`,
`-v`, `-h` as the `lua` command; with no arguments on a terminal, the REPL: `lm` preloaded,
values printed (the last in `_`), TAB completion (also of lumen's lazily loaded parts:
`lm.op<TAB>` gives `lm.optim`), `help(x)` / `?x`, history in `$LUMEN_HISTORY` (default
`~/.lumen_history`), `LUMEN_NO_READLINE=1` for plain input. Ctrl-C at the prompt drops the line;
during an evaluation it stops it and returns to the prompt, every time. Code typed at the prompt
runs in LuaJIT's interpreter so that Ctrl-C reaches every loop; what it calls (lumen, modules
loaded from files) is compiled as usual, and a long C operation finishes before the interrupt is
seen.]])
E("lm.help", "lm.help(x) -> string", "The text help(x) prints in the REPL (signature, "
   .. "description, options, memory format, errors), for scripts: print(lm.help(lm.zeros)).",
   { note = "loaded on first use from lumen.doc" })
E("lm.doc", "lm.doc", "This reference as a Lua table (lua/lumen/doc.lua): doc.entries[name] = "
   .. "{name, sig, desc, opts, fmt, err, note}, doc.list and doc.sections in document order, "
   .. "doc.help(x) -> text.")
E("help", "help(x) / ?x", "In the REPL: the signature and description of x (a function, "
   .. "module, class, tensor or module instance, or a name such as \"conv2d\" or "
   .. "\"Tensor:add\"); help() explains the REPL.", { note = "from lua/lumen/doc.lua, the "
   .. "table this page is generated from" })


-- names the API contract fixes for later work that do not exist yet (listed on docs/api.md so
-- that nobody looks for them); an entry replaces the line once one exists
M.planned = {}

-- ---------------------------------------------------------------------------------------------
-- lookup

-- where the object prefixes of entry names live
local OWNERS = {
   Tensor = { "Tensor" },
   Module = { "nn", "Module" },
   Optimizer = { "optim", "Optimizer" },
   GradScaler = { "amp", "GradScaler" },
}

-- the value an entry names, looked up with rawget only (nothing is loaded); nil when its
-- module is not loaded yet or the entry is a field
local function resolve(name)
   local lm = package.loaded["lumen"]
   if type(lm) ~= "table" then return nil end
   local parts = {}
   local owner, method = name:match("^(%u%a*):([%w_]+)$")
   if owner then
      local path = OWNERS[owner]
      if not path then return nil end
      for _, p in ipairs(path) do parts[#parts + 1] = p end
      parts[#parts + 1] = method
   else
      local rest = name:match("^lm%.(.+)$")
      if not rest then return nil end
      for p in rest:gmatch("[^%.]+") do parts[#parts + 1] = p end
   end
   local v = lm
   for _, p in ipairs(parts) do
      if type(v) ~= "table" then return nil end
      v = rawget(v, p)
      if v == nil then return nil end
   end
   return v
end
M.resolve = resolve

-- value -> the first entry (document order) naming it, among the loaded modules
local function find_value(v)
   if v == nil then return nil end
   for _, e in ipairs(M.list) do
      if resolve(e.name) == v then return e end
   end
   return nil
end

-- a name as typed: `lm.nn.functional.x` and `lm.functional.x` are `lm.F.x`; `t:add` (any
-- object) is found through its value
local function normalize(name)
   name = name:gsub("^lm%.nn%.functional%.", "lm.F."):gsub("^lm%.functional%.", "lm.F.")
   return name
end

-- entries whose name is `name` or ends in `.name` / `:name`
local function find_name(name)
   name = normalize(name)
   if M.entries[name] then return { M.entries[name] } end
   local out = {}
   for _, e in ipairs(M.list) do
      local tail = e.name:match("[%.:]([%w_]+)$")
      if tail == name then out[#out + 1] = e end
   end
   return out
end

local function wrap(text, indent, width)
   local lines, line = {}, indent
   for word in text:gmatch("%S+") do
      if #line > #indent and #line + 1 + #word > width then
         lines[#lines + 1] = line
         line = indent .. word
      else
         line = (#line > #indent) and (line .. " " .. word) or (line .. word)
      end
   end
   if #line > #indent then lines[#lines + 1] = line end
   return table.concat(lines, "\n")
end

local function entry_text(e, short)
   local out = { e.sig, wrap(e.desc, "  ", 96) }
   if not short then
      if e.opts then out[#out + 1] = wrap("options: " .. e.opts, "  ", 96) end
      if e.fmt then out[#out + 1] = wrap("memory format: " .. e.fmt, "  ", 96) end
      if e.err then out[#out + 1] = wrap("errors: " .. e.err, "  ", 96) end
      out[#out + 1] = "  (docs/api.md, " .. e.name .. ")"
   end
   return table.concat(out, "\n")
end
M.entry_text = entry_text

local GENERAL = [[
lumen REPL: `lm` is require("lumen"). Type a Lua statement or expression; values are printed,
the last one is kept in `_`.
  help(x), ?x     the signature and description of x (a function, module or class; or a name:
                  help("conv2d"))
  TAB             completes globals and fields (lm.op<TAB> -> lm.optim)
  Ctrl-C          drops the line being typed; stops a running computation
  Ctrl-D          quits
The whole API: docs/api.md.]]

--- help(x [, expr]) -> text. x: a value (function, module, class, tensor, module instance), a
--- name ("lm.zeros", "conv2d", "Tensor:add") or nothing; expr: the text the value came from.
function M.help(...)
   local n = select("#", ...)
   local x, expr = ...
   if n == 0 then return GENERAL end
   if expr then
      local hits = find_name(expr)
      if #hits == 1 then return entry_text(hits[1]) end
   end
   local e = type(x) ~= "string" and find_value(x) or nil
   if e then return entry_text(e) end
   local lm = package.loaded["lumen"]
   if type(lm) == "table" then
      if type(rawget(lm, "is_tensor")) == "function" and lm.is_tensor(x) then
         return tostring(x) .. "\n" .. entry_text(M.entries["lm.Tensor"], true)
            .. "\n  (methods: help(\"Tensor:<name>\"); docs/api.md, Tensor methods)"
      end
      local nn = rawget(lm, "nn")
      if type(nn) == "table" and type(x) == "table" and nn.is_module and nn.is_module(x) then
         local cls = getmetatable(x)
         local ce = cls and find_value(cls)
         if ce then return entry_text(ce) end
         return entry_text(M.entries["lm.nn.Module"])
      end
   end
   if type(x) == "string" then
      local hits = find_name(x)
      if #hits == 1 then return entry_text(hits[1]) end
      if #hits > 1 then
         local out = {}
         for _, h in ipairs(hits) do out[#out + 1] = entry_text(h, true) end
         return table.concat(out, "\n")
      end
      return "no help for " .. string.format("%q", x)
   end
   local what = expr or tostring(x)
   if type(x) == "function" then
      local info = debug.getinfo(x, "S")
      local where = info and info.short_src and info.linedefined
         and (info.short_src .. ":" .. info.linedefined) or "?"
      return "no help for " .. what .. " (a function defined at " .. where .. ")"
   end
   return "no help for " .. what .. " (a " .. type(x) .. " value)"
end

return M
