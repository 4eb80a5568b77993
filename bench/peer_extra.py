#!/usr/bin/python3
"""lumen's own peer rows: PyTorch timings for operators that ../shared/peer/bench_ops.py does not
time (pool and batch-norm backward, avg_pool2d, plain add and mul). Same measure and output:
'<op> <fmt> <ms>', the median of ITERS runs after one warm-up. Gradients are reset to None before
every backward, as bench/ops.lua does, so no row includes gradient accumulation.
Usage: bench/peer_extra.py [threads] [iters]"""
import sys, time, torch
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
ITERS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
def med(fn):
    fn(); ts = []
    for _ in range(ITERS):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e3
cl = torch.channels_last
torch.manual_seed(0)
for fmt in ("nchw", "nhwc"):
    mf = cl if fmt == "nhwc" else torch.contiguous_format
    x = torch.randn(8, 64, 56, 56).contiguous(memory_format=mf)
    xr = x.clone().requires_grad_()
    g = torch.randn_like(x)
    bn = torch.nn.BatchNorm2d(64).train()
    def fwd_bwd(f):
        def run():
            xr.grad = None
            bn.weight.grad = None
            bn.bias.grad = None
            y = f(xr)
            y.backward(torch.ones_like(y) if y.shape != x.shape else g)
        return run
    rows = [
        ("add", lambda: x + x),
        ("mul", lambda: x * x),
        ("avg_pool2d_3s2p1", lambda: F.avg_pool2d(x, 3, 2, 1)),
        ("avg_pool2d_2s2", lambda: F.avg_pool2d(x, 2, 2)),
        ("max_pool2d_3s2p1_fwd_bwd", fwd_bwd(lambda t: F.max_pool2d(t, 3, 2, 1))),
        ("avg_pool2d_3s2p1_fwd_bwd", fwd_bwd(lambda t: F.avg_pool2d(t, 3, 2, 1))),
        ("adaptive_avg_pool2d_1_fwd_bwd", fwd_bwd(lambda t: F.adaptive_avg_pool2d(t, 1))),
        ("adaptive_avg_pool2d_7_fwd_bwd", fwd_bwd(lambda t: F.adaptive_avg_pool2d(t, 7))),
        ("batch_norm_train_fwd_bwd", fwd_bwd(lambda t: bn(t))),
    ]
    for name, fn in rows:
        print("%s %s %.3f" % (name, fmt, med(fn)))
