#!/usr/bin/env python3
"""bench/peer_train_profile.py -- PyTorch's side of bench/train_profile.sh: the resnet50 training
step of bench/models.lua (torchvision resnet50, batch 8, 3x224x224, channels-last, SGD lr 0.01
momentum 0.9, cross_entropy; zero_grad, forward, loss, backward, step) timed plainly, then under
torch.profiler, its self CPU time bucketed into the rows bench/train_profile.lua prints.

    python bench/peer_train_profile.py [threads] [steps] [bf16] [nosplit] [raw] [verbose]

Prints '<row>|<ms per step>' lines (the same row names as bench/train_profile.lua):
  step|<ms>            median of `steps` plain steps (after two warm-ups)
  profiled step|<ms>   wall time per step under the profiler (its overhead: the difference)
  op:<name>|<ms>       self CPU time per step of the ops of one kind (see ROWS)
  other (framework: Lua / Python)|<ms>  the profiled step minus the sum of the op rows
  shape:<kxk Cin->Cout sS, HxW in>|<fwd>|<bwd data>|<bwd weight>|<calls>  oneDNN's own time per
                       step of each convolution shape's primitives (the verbose steps below)
With "bf16" the forward and the loss run under torch.autocast("cpu", dtype=torch.bfloat16).
"raw" prints the self time by row and profiler event on stderr, "verbose" oneDNN's sums,
"nosplit" leaves the convolution backward whole (no oneDNN verbose steps).

The convolution backward: aten::convolution_backward computes grad_input and grad_weight in one
op (aten::mkldnn_convolution_backward calls oneDNN's backward-data and backward-weights
primitives, which the profiler does not show). The split comes from oneDNN's own timing:
two more steps run with ONEDNN_VERBOSE on (torch.backends.mkldnn.verbose), its 'exec' lines
(primitive kind, propagation kind, milliseconds) are summed, and the profiled convolution
backward time is split in the proportion of the backward_data and backward_weights primitives
(the conversions/reorders oneDNN runs around them stay in the proportion). The rows say so:
'conv backward data' and 'conv backward weight' are that split; 'onednn:' rows give oneDNN's
raw sums per step.
"""
import os
import re
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
import torchvision

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
words = set(sys.argv[3:])
amp = "bf16" in words
torch.set_num_threads(threads)
torch.manual_seed(0)

model = torchvision.models.resnet50(num_classes=1000).to(memory_format=torch.channels_last)
model.train()
x = torch.randn(8, 3, 224, 224).contiguous(memory_format=torch.channels_last)
tgt = torch.randint(0, 1000, (8,))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def step():
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = F.cross_entropy(model(x), tgt)
    loss.backward()
    opt.step()


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


step()
step()
plain = []
for _ in range(steps):
    t = time.perf_counter()
    step()
    plain.append(time.perf_counter() - t)

# ---- the profiled steps ----------------------------------------------------------------------
from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU], record_shapes=False, with_stack=False) as prof:
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    profiled = (time.perf_counter() - t0) / steps

# a row for an event name: forward ops by their aten name, backward ops by their autograd node
# (the outermost classified event owns the self time of everything under it, as lumen's rows hold
# the allocations and dtype casts their ops make -- except the casts, which get their own row on
# both sides)
FWD = [
    (r"^aten::(conv2d|convolution|_convolution|mkldnn_convolution)$", "conv forward"),
    (r"^aten::(batch_norm|_batch_norm_impl_index|native_batch_norm|_native_batch_norm_legit)",
     "batch norm forward"),
    (r"^aten::(relu|relu_|threshold|threshold_|clamp_min|clamp_min_)$", "relu forward"),
    (r"^aten::(add|add_)$", "add forward (residual)"),
    (r"^aten::(max_pool2d|max_pool2d_with_indices)$", "max_pool2d forward"),
    (r"^aten::(adaptive_avg_pool2d|_adaptive_avg_pool2d|mean)$", "adaptive_avg_pool2d forward"),
    (r"^aten::(linear|addmm|matmul|mm|t)$", "linear forward"),
    (r"^aten::(cross_entropy_loss|log_softmax|_log_softmax|nll_loss|nll_loss_nd|nll_loss_forward)$",
     "cross_entropy forward"),
    (r"^aten::(flatten|view|reshape|_reshape_alias)$", "flatten/view"),
]
BWD = [
    (r"ConvolutionBackward", "conv backward (data + weight)"),
    (r"(NativeBatchNormBackward|CudnnBatchNormBackward|BatchNormBackward)", "batch norm backward"),
    (r"(ReluBackward|ThresholdBackward)", "relu backward"),
    (r"AddBackward", "add backward (residual)"),
    (r"MaxPool2DWithIndicesBackward", "max_pool2d backward"),
    (r"(AdaptiveAvgPool2DBackward|MeanBackward)", "adaptive_avg_pool2d backward"),
    (r"(AddmmBackward|MmBackward|TBackward)", "linear backward"),
    (r"(NllLossBackward|LogSoftmaxBackward)", "cross_entropy backward"),
    (r"(ViewBackward|ReshapeAliasBackward|UnsafeViewBackward)", "flatten/view"),
    (r"ToCopyBackward", "dtype casts (bf16)"),
]
RULES = (
    [(r"^Optimizer\.step", "optimizer step"), (r"^Optimizer\.zero_grad", "zero_grad"),
     (r"AccumulateGrad", "gradient accumulation")]
    + [(r"^autograd::engine::evaluate_function: .*" + p, r) for p, r in BWD]
    + [(r"^" + p + r"\d*$", r) for p, r in BWD]
    + FWD
    + [(r"^aten::(empty|empty_like|empty_strided|zeros|zeros_like|zero_|fill_|resize_)$",
        "allocation/collection")]
)
RULES = [(re.compile(p), r) for p, r in RULES]
CAST = re.compile(r"^aten::(to|_to_copy|copy_)$")


def classify(name):
    for p, r in RULES:
        if p.search(name):
            return r
    return None


rows = {}
raw = {}
events = prof.events()
cache = {}


def owner(ev):
    """the row of the outermost classified ancestor (or the event itself)"""
    if ev.id in cache:
        return cache[ev.id]
    r = None
    par = ev.cpu_parent
    # the engine sums the gradients of a tensor used twice (the residual branches) with an
    # aten::add beside the node, directly under evaluate_function: lumen's GradAdd
    if (par is not None and par.name.startswith("autograd::engine::evaluate_function:")
            and ev.name in ("aten::add", "aten::add_")):
        cache[ev.id] = "gradient accumulation"
        return cache[ev.id]
    # autocast's casts (nested in the forward op they feed) are a row of their own; any other
    # to/copy_ (the layout copies inside aten::convolution_backward, a copy_ in the optimizer)
    # stays its op's
    cast = amp and CAST.search(ev.name) is not None
    chain, e = [], ev.cpu_parent
    while e is not None:
        chain.append(e)
        e = e.cpu_parent
    outer = None
    for a in reversed(chain):
        outer = classify(a.name)
        if outer is not None:
            break
    if cast and outer is not None and outer.endswith(" forward"):
        r = "dtype casts (bf16)"
    else:
        r = outer if outer is not None else classify(ev.name)
    cache[ev.id] = r
    return r


for ev in events:
    if ev.device_type != torch.autograd.DeviceType.CPU:
        continue
    r = owner(ev)
    if r is None:
        r = "other op: " + ev.name
    rows[r] = rows.get(r, 0.0) + ev.self_cpu_time_total / 1e3 / steps  # us -> ms per step
    k = (r, ev.name)
    raw[k] = raw.get(k, 0.0) + ev.self_cpu_time_total / 1e3 / steps
if "raw" in words:
    print("self time by row and event (ms per step):", file=sys.stderr)
    for (r, name), ms in sorted(raw.items(), key=lambda kv: -kv[1]):
        if ms >= 0.05:
            print("  %-34s %-58s %9.3f" % (r[:34], name[:58], ms), file=sys.stderr)

# ---- oneDNN's own split of the convolution backward -------------------------------------------
onednn = {}
# oneDNN's problem descriptor: mb8_ic64oc64_ih56oh56kh3sh1dh0ph1_iw56ow56kw3sw1dw0pw1 (g<n> first
# for grouped convolutions)
DESC = re.compile(r"ic(\d+)oc(\d+)_ih(\d+)oh\d+kh(\d+)sh(\d+).*_iw(\d+)ow\d+kw(\d+)")
SHAPE_COL = {"forward_training": 0, "backward_data": 1, "backward_weights": 2}
shapes = {}
if "nosplit" not in words:
    fd, path = tempfile.mkstemp(prefix="lumen-onednn-", suffix=".txt")
    os.close(fd)
    sys.stdout.flush()
    saved = os.dup(1)
    out = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.dup2(out, 1)
    try:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            for _ in range(2):
                step()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(out)
        os.close(saved)
    with open(path) as f:
        for line in f:
            p = line.strip().split(",")
            if len(p) < 6 or not p[0].startswith("onednn_verbose") or "exec" not in p:
                continue
            i = p.index("exec")
            # onednn_verbose,[timestamp,]primitive,exec,cpu,<kind>,<impl>,<prop>,...,<ms>
            kind, prop = p[i + 2], p[i + 4]
            try:
                ms = float(p[-1])
            except ValueError:
                continue
            key = kind + " " + prop
            onednn[key] = onednn.get(key, 0.0) + ms / 2
            m = DESC.search(p[-2]) if kind == "convolution" else None
            if m and prop in SHAPE_COL:
                ic, oc, ih, kh, sh, iw, kw = (int(v) for v in m.groups())
                k = "%dx%d %d->%d s%d, %dx%d in" % (kh, kw, ic, oc, sh, ih, iw)
                e = shapes.setdefault(k, [0.0, 0.0, 0.0, 0])
                e[SHAPE_COL[prop]] += ms / 2
                if prop == "forward_training":
                    e[3] += 0.5
    os.unlink(path)
    if "verbose" in words:
        for k, v in sorted(onednn.items(), key=lambda kv: -kv[1]):
            print("# onednn %-40s %8.2f ms/step" % (k, v), file=sys.stderr)

bd = onednn.get("convolution backward_data", 0.0)
bw = onednn.get("convolution backward_weights", 0.0)
conv_bwd = rows.pop("conv backward (data + weight)", 0.0)
if bd + bw > 0:
    rows["conv backward data"] = conv_bwd * bd / (bd + bw)
    rows["conv backward weight"] = conv_bwd * bw / (bd + bw)
    for k, v in sorted(onednn.items()):
        print("onednn:%s (oneDNN's own time)|%.3f" % (k, v))
else:
    rows["conv backward (data + weight)"] = conv_bwd

print("step|%.3f" % (median(plain) * 1e3))
print("profiled step|%.3f" % (profiled * 1e3))
total = 0.0
small = 0.0
for r, ms in sorted(rows.items(), key=lambda kv: -kv[1]):
    total += ms
    if r.startswith("other op: "):
        if ms >= 0.5:
            print("op:%s|%.3f" % (r, ms))
        else:
            small += ms
        continue
    print("op:%s|%.3f" % (r, ms))
if small > 0:
    print("op:other op: (each < 0.5 ms)|%.3f" % small)
print("other (framework: Lua / Python)|%.3f" % (profiled * 1e3 - total))
for k, e in shapes.items():
    print("shape:%s|%.3f|%.3f|%.3f|%.1f" % (k, e[0], e[1], e[2], e[3]))
