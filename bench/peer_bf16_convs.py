# bench/peer_bf16_convs.py -- the rows of bench/bf16_convs.lua from PyTorch 2.x (bfloat16
# tensors, channels-last, oneDNN: AMX where the CPU has it). Usage:
#   python bench/peer_bf16_convs.py [threads] [iters] [bwd]
import sys, time
import torch
import torch.nn.functional as F

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
bwd = len(sys.argv) > 3 and sys.argv[3] == "bwd"
torch.set_num_threads(threads)
torch.manual_seed(0)
CL = torch.channels_last
shapes = [
    (3, 64, 224, 7, 2),
    (64, 64, 56, 1, 1), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1), (256, 64, 56, 1, 1),
    (256, 128, 56, 1, 1), (128, 128, 56, 3, 2), (128, 128, 28, 3, 1), (128, 512, 28, 1, 1),
    (512, 128, 28, 1, 1), (256, 512, 56, 1, 2),
    (512, 256, 28, 1, 1), (256, 256, 28, 3, 2), (256, 256, 14, 3, 1), (256, 1024, 14, 1, 1),
    (1024, 256, 14, 1, 1), (512, 1024, 28, 1, 2),
    (1024, 512, 14, 1, 1), (512, 512, 14, 3, 2), (512, 512, 7, 3, 1), (512, 2048, 7, 1, 1),
    (2048, 512, 7, 1, 1), (1024, 2048, 14, 1, 2),
]


def median_ms(fn):
    fn()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1000


for C, O, H, k, st in shapes:
    x = torch.randn(8, C, H, H).bfloat16().contiguous(memory_format=CL)
    w = (torch.randn(O, C, k, k) / (C * k * k) ** 0.5).bfloat16().contiguous(memory_format=CL)
    b = torch.randn(O).bfloat16()
    pad = (k - 1) // 2
    name = "conv%dx%d_%dto%d_%d_s%d_b8" % (k, k, C, O, H, st)
    with torch.no_grad():
        print("%s_fwd nhwc %.3f" % (name, median_ms(lambda: F.conv2d(x, w, b, st, pad))))
    if bwd:
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = F.conv2d(xr, wr, None, st, pad)
        g = torch.randn(y.shape).bfloat16().contiguous(memory_format=CL)

        def step():
            xr.grad, wr.grad = None, None
            F.conv2d(xr, wr, None, st, pad).backward(g)
        print("%s_bwd nhwc %.3f" % (name, median_ms(step)))
