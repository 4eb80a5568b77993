#!/usr/bin/env python3
"""The peer rows of bench/video_ops.lua: PyTorch 2.x (from ../shared/peer/setup_torch2.sh), the
same 3-D operators, shapes and measure -- '<op> <fmt> <ms>', fmt ncdhw (contiguous) or ndhwc
(torch.channels_last_3d input, weight and gradient), the median of ITERS calls after one warm-up
(conv3d rows: max(3, ITERS // 2) calls). Batch 2, float32, no bias; the layers of torchvision's
r3d_18, r2plus1d_18's layer1 (2+1)-D pair, max/avg/adaptive-avg pool3d, BatchNorm3d.
Usage: bench/peer_video.py [threads] [iters] [filter]"""
import sys, time, math, torch
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
ITERS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
FILTER = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
CONV_ITERS = max(3, ITERS // 2)
N = 2

def med(fn, iters):
    fn(); ts = []
    for _ in range(iters):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e3

def row(name, fmt, fn, iters=None):
    if FILTER and FILTER not in name:
        return
    print("%s %s %.3f" % (name, fmt, med(fn, iters or ITERS)), flush=True)

def wanted(name):
    return not FILTER or FILTER in name + "_fwd_bwd"

torch.manual_seed(0)
for fmt in ("ncdhw", "ndhwc"):
    mf = torch.channels_last_3d if fmt == "ndhwc" else torch.contiguous_format
    def rnd(*sizes, scale=1.0):
        return (torch.randn(*sizes) * scale).contiguous(memory_format=mf)

    def conv(name, cin, cout, d, hw, k, stride=1, padding=0, no_input_grad=False):
        if not wanted(name):
            return
        x = rnd(N, cin, d, hw, hw)
        w = rnd(cout, cin, *k, scale=1 / math.sqrt(cin * k[0] * k[1] * k[2]))
        g = rnd(*F.conv3d(x, w, None, stride, padding).shape)
        row(name + "_fwd", fmt, lambda: F.conv3d(x, w, None, stride, padding), CONV_ITERS)
        xr = x if no_input_grad else x.clone().requires_grad_()
        wr = w.clone().requires_grad_()
        def fb():
            xr.grad = None; wr.grad = None
            F.conv3d(xr, wr, None, stride, padding).backward(g)
        row(name + "_fwd_bwd", fmt, fb, CONV_ITERS)

    conv("conv3d_stem_3to64_3x7x7_s122_8x112_b2", 3, 64, 8, 112, (3, 7, 7), (1, 2, 2), (1, 3, 3),
         no_input_grad=True)
    conv("conv3d_l1_64_3x3x3_8x56_b2", 64, 64, 8, 56, (3, 3, 3), 1, 1)
    conv("conv3d_l2_128_3x3x3_4x28_b2", 128, 128, 4, 28, (3, 3, 3), 1, 1)
    conv("conv3d_l2ds_64to128_1x1x1_s2_8x56_b2", 64, 128, 8, 56, (1, 1, 1), 2, 0)
    conv("conv3d_l3_256_3x3x3_2x14_b2", 256, 256, 2, 14, (3, 3, 3), 1, 1)
    conv("conv3d_l4_512_3x3x3_1x7_b2", 512, 512, 1, 7, (3, 3, 3), 1, 1)
    conv("conv3d_r21d_s_64to144_1x3x3_8x56_b2", 64, 144, 8, 56, (1, 3, 3), 1, (0, 1, 1))
    conv("conv3d_r21d_t_144to64_3x1x1_8x56_b2", 144, 64, 8, 56, (3, 1, 1), 1, (1, 0, 0))

    x = rnd(N, 64, 8, 56, 56)
    xg = x.clone().requires_grad_()
    def pool(name, f):
        if not wanted(name):
            return
        # the gradient in the output's own layout (PyTorch's avg_pool3d and adaptive_avg_pool3d
        # return contiguous for a channels_last_3d input)
        g = torch.randn_like(f(x))
        row(name + "_fwd", fmt, lambda: f(x))
        def fb():
            xg.grad = None
            f(xg).backward(g)
        row(name + "_fwd_bwd", fmt, fb)
    pool("max_pool3d_3s2p1_64_8x56_b2", lambda t: F.max_pool3d(t, 3, 2, 1))
    pool("avg_pool3d_3s2p1_64_8x56_b2", lambda t: F.avg_pool3d(t, 3, 2, 1))
    pool("adaptive_avg_pool3d_1_64_8x56_b2", lambda t: F.adaptive_avg_pool3d(t, 1))

    if wanted("batch_norm3d_train_64_8x56_b2") or wanted("batch_norm3d_eval_64_8x56_b2"):
        bn = torch.nn.BatchNorm3d(64).train()
        g = rnd(N, 64, 8, 56, 56)
        row("batch_norm3d_train_64_8x56_b2_fwd", fmt, lambda: bn(x))
        def bn_fb():
            xg.grad = None; bn.weight.grad = None; bn.bias.grad = None
            bn(xg).backward(g)
        row("batch_norm3d_train_64_8x56_b2_fwd_bwd", fmt, bn_fb)
        bn.eval()
        def bn_eval():
            with torch.no_grad():
                return bn(x)
        row("batch_norm3d_eval_64_8x56_b2", fmt, bn_eval)
