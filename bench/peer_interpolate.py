#!/usr/bin/python3
"""Peer timing for bench/interpolate.lua: F.interpolate (scale_factor 2, channels-last) forward
and forward + backward in PyTorch, medians of 5 / 3, ms, 2 threads.
Args: [N C H ...] (default: 8 64 32, 8 64 128, 2 32 256)"""
import sys, time, torch
torch.set_num_threads(2)
a = [int(v) for v in sys.argv[1:]]
shapes = [tuple(a[i:i + 3]) for i in range(0, len(a), 3)] or [(8, 64, 32), (8, 64, 128), (2, 32, 256)]
def med(f, n):
    f(); ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort(); return ts[n // 2]
for N, C, H in shapes:
    x = torch.randn(N, C, H, H).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    g = torch.randn(N, C, 2 * H, 2 * H).contiguous(memory_format=torch.channels_last)
    for mode in ["nearest", "bilinear"]:
        def f():
            with torch.no_grad(): torch.nn.functional.interpolate(x, scale_factor=2, mode=mode)
        def fb():
            x.grad = None; torch.nn.functional.interpolate(x, scale_factor=2, mode=mode).backward(g)
        print("%dx%dx%d %-8s torch fwd %.2f fwd+bwd %.2f ms" % (N, C, H, mode, med(f, 5), med(fb, 3)))
