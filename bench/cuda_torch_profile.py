#!/usr/bin/python3
"""PyTorch's side of the CUDA profile (tools/gpu_check.sh, GPU_CHECK_PROFILE=1): one torchvision
model's training or inference step on the GPU under torch.profiler, the CUDA time per kernel
summed over `iters` steps after warm-ups, beside lumen's LUMEN_CUDA_PROFILE table of the same step.
Args: model batch mode(train|infer) fmt(nhwc|nchw) prec(amp|fp32) iters"""
import sys, torch, torchvision
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity

name, bs, mode, fmt, prec, iters = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
torch.backends.cudnn.benchmark = True
m = getattr(torchvision.models, name)(num_classes=1000).cuda()
x = torch.randn(bs, 3, 224, 224, device="cuda")
tgt = torch.randint(0, 1000, (bs,), device="cuda")
if fmt == "nhwc":
    m = m.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)
amp = prec == "amp"
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

def step():
    if mode == "train":
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(m(x), tgt)
        loss.backward()
        opt.step()
    else:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            m(x)

m.train(mode == "train")
for _ in range(3):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
print(f"torch profile: {name} {mode} {fmt} b{bs} {prec}, {iters} steps")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
