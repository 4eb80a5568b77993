#!/usr/bin/env python3
"""The peer rows of bench/amp_ops.lua: PyTorch (2.x, from ../shared/peer/setup_torch2.sh) on
bfloat16 tensors, batch 8, 64 channels, 56x56, both formats; batch norm with float32 parameters
(as under autocast); a 1024^3 bf16 matrix product. '<op>_bf16 <fmt> <ms>', the median of ITERS
runs after one warm-up. Usage: bench/peer_amp.py [threads] [iters]"""
import sys, time, torch
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
ITERS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
def med(fn):
    fn(); ts = []
    for _ in range(ITERS):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e3
torch.manual_seed(0)
bf = torch.bfloat16
for fmt in ("nchw", "nhwc"):
    mf = torch.channels_last if fmt == "nhwc" else torch.contiguous_format
    x = torch.randn(8, 64, 56, 56).to(bf).contiguous(memory_format=mf)
    w3 = (torch.randn(64, 64, 3, 3) / 24).to(bf).contiguous(memory_format=mf)
    w1 = (torch.randn(256, 64, 1, 1) / 8).to(bf).contiguous(memory_format=mf)
    xr = x.clone().requires_grad_(); w3r = w3.clone().requires_grad_()
    bn = torch.nn.BatchNorm2d(64).train()
    g = torch.randn(8, 64, 56, 56).to(bf).contiguous(memory_format=mf)
    def conv_fb():
        y = F.conv2d(xr, w3r, padding=1); y.backward(torch.ones_like(y))
        xr.grad = None; w3r.grad = None
    def bn_fb():
        xr.grad = None; bn.weight.grad = None; bn.bias.grad = None
        bn(xr).backward(g)
    rows = [
        ("conv3x3_64_56_b8_fwd", lambda: F.conv2d(x, w3, padding=1)),
        ("conv1x1_64to256_56_b8_fwd", lambda: F.conv2d(x, w1)),
        ("conv3x3_64_56_b8_fwd_bwd", conv_fb),
        ("max_pool2d_3s2p1", lambda: F.max_pool2d(x, 3, 2, 1)),
        ("adaptive_avg_pool2d_1", lambda: F.adaptive_avg_pool2d(x, 1)),
        ("batch_norm_train_fwd_bwd", bn_fb),
        ("add_relu", lambda: (x + x).relu()),
    ]
    for name, fn in rows:
        print("%s_bf16 %s %.3f" % (name, fmt, med(fn)))
a = torch.randn(1024, 1024).to(bf); b = torch.randn(1024, 1024).to(bf)
print("matmul_1024_bf16 - %.3f" % med(lambda: a @ b))
