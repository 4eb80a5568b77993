#!/usr/bin/env python3
"""The PyTorch side of bench/amp_accuracy.sh: how far bf16 autocast moves ResNet50's logits.

    python tools/amp_accuracy.py OUT_DIR      (a PyTorch 2.x python: ../shared/peer/setup_torch2.sh)

Builds torchvision's resnet50 from a fixed seed, calibrates its batch-norm running statistics on
three random batches (so that eval mode sees realistic statistics), and writes into OUT_DIR:
  resnet50_amp.weights.safetensors  the state_dict (torchvision key names)
  resnet50_amp.ref.safetensors      input (4x3x224x224), logits in float64 (the reference),
                                    float32, and under torch.autocast("cpu", bfloat16), all in
                                    eval mode on a channels-last model and input
and prints PyTorch's own errors against float64 (max |a - b| / max |b|, and the 2-norm).
The files are written with tools/gen_peer_models.py's safetensors writer."""
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_peer_models import write_safetensors  # noqa: E402

SEED = 20261204


def errs(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item(), ((a - b).norm() / b.norm()).item()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/lumen-amp-acc"
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    model = torchvision.models.resnet50()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in bns:
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 224, 224, generator=g))
    for m in bns:
        m.momentum = 0.1
    model.eval()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    write_safetensors(os.path.join(out, "resnet50_amp.weights.safetensors"), sd,
                      {"format": "pt", "model": "resnet50"})
    x = torch.randn(4, 3, 224, 224, generator=g)
    cl = torch.channels_last
    with torch.no_grad():
        m64 = torchvision.models.resnet50().double()
        m64.load_state_dict(sd)
        m64.eval()
        l64 = m64(x.double())
        m = model.to(memory_format=cl)
        xc = x.contiguous(memory_format=cl)
        l32 = m(xc)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lbf = m(xc)
    ref = {"input": x, "logits_f64": l64, "logits_f32": l32, "logits_bf16": lbf.float()}
    write_safetensors(os.path.join(out, "resnet50_amp.ref.safetensors"), ref,
                      {"torch": torch.__version__})
    print("PyTorch %s float32 vs float64: max %.3e, norm %.3e" % ((torch.__version__,) +
                                                                    errs(l32, l64)))
    print("PyTorch %s bf16 autocast vs float64: max %.3e, norm %.3e" % ((torch.__version__,) +
                                                                         errs(lbf, l64)))


if __name__ == "__main__":
    main()
