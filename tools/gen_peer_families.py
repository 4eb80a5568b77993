#!/usr/bin/env python3
"""The PyTorch side of spec/model_families_spec.lua: torchvision's MobileNet V2/V3, EfficientNet,
ConvNeXt, RegNet and ShuffleNet V2, their weights and reference results.

    <peer python> tools/gen_peer_families.py gen [--out /tmp/lumen-peer-families] [--models a,b]

The weights are too large to commit (convnext_tiny alone is 110 MB), so the spec runs this with
the peer interpreter (LUMEN_PEER_PYTHON, else ~/.cache/lumen-peer-torch2/bin/python) when its
files are missing or older than this script, and is pending without one.

For each model (torchvision's constructor with dropout=0 and stochastic_depth_prob=0 where it
has them, so that a training step is deterministic; random weights from a fixed seed, then
batch-norm scales/shifts and ConvNeXt's layer scales drawn at random so that every block
matters, and batch-norm running statistics calibrated on a few random batches) it writes:

  <model>.weights.safetensors   the state_dict (torchvision's key names)
  <model>.ref.safetensors       input (2x3x64x64), target (0-based), logits_eval (float32);
                                for one training step in float64 (train mode, cross entropy):
                                f64.loss and f64.grad.<key> for a few parameters (metadata
                                "keys"); and loss32 with metadata "torch_f32_err": PyTorch's OWN
                                float32 gradient errors against its float64 ones (2-norm
                                relative), the yardstick for lumen's float32 gradients.

and shapes.json: every state_dict key and shape of every variant (b1-b3, convnext small/base,
the RegNet family, the other ShuffleNets), for the structure check without weights.
"""
import argparse
import json
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_peer_models import write_safetensors  # noqa: E402

SEED = 20240640
MODELS = ["mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "efficientnet_b0",
          "convnext_tiny", "regnet_y_400mf", "shufflenet_v2_x1_0"]
VARIANTS = ["mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
            "efficientnet_b0", "efficientnet_b1", "efficientnet_b2", "efficientnet_b3",
            "convnext_tiny", "convnext_small", "convnext_base",
            "regnet_y_400mf", "regnet_y_800mf", "regnet_y_1_6gf", "regnet_y_3_2gf",
            "regnet_y_8gf", "regnet_y_16gf", "regnet_y_32gf",
            "regnet_x_400mf", "regnet_x_800mf", "regnet_x_1_6gf", "regnet_x_3_2gf",
            "regnet_x_8gf", "regnet_x_16gf", "regnet_x_32gf",
            "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5",
            "shufflenet_v2_x2_0"]


def build(name):
    kw = {}
    if name.startswith(("mobilenet", "efficientnet")):
        kw["dropout"] = 0.0
    if name.startswith(("efficientnet", "convnext")):
        kw["stochastic_depth_prob"] = 0.0
    return getattr(torchvision.models, name)(**kw)


def randomize(model, gen):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
            if hasattr(m, "layer_scale"):
                m.layer_scale.copy_(torch.rand(m.layer_scale.shape, generator=gen) * 0.5 + 0.1)


def calibrate(model, gen):
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    if not bns:
        return
    for m in bns:
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 64, 64, generator=gen))
    for m in bns:
        m.momentum = 0.1


def grad_keys(model):
    names = [k for k, _ in model.named_parameters()]
    step = max(1, len(names) // 8)
    keys = names[::step]
    for k in names[-2:]:
        if k not in keys:
            keys.append(k)
    return keys


def rel2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-300)).item()


def write_shapes(out):
    # the initialisers are skipped (only the shapes are wanted; regnet_y_32gf has 145M weights)
    saved = {}
    for fn in ("kaiming_normal_", "kaiming_uniform_", "normal_", "uniform_", "zeros_", "ones_",
               "constant_", "trunc_normal_"):
        saved[fn] = getattr(torch.nn.init, fn)
        setattr(torch.nn.init, fn, lambda t, *a, **k: t)
    shapes = {}
    try:
        for name in VARIANTS:
            m = getattr(torchvision.models, name)()
            shapes[name] = [[k, list(v.shape)] for k, v in m.state_dict().items()]
            del m
    finally:
        for fn, f in saved.items():
            setattr(torch.nn.init, fn, f)
    with open(os.path.join(out, "shapes.json"), "w") as f:
        json.dump(shapes, f)


def gen(out, models):
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for name in models:
        torch.manual_seed(SEED)
        g = torch.Generator().manual_seed(SEED + 1)
        model = build(name)
        randomize(model, g)
        calibrate(model, g)
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        write_safetensors(os.path.join(out, name + ".weights.safetensors"), sd,
                          {"format": "pt", "model": name})
        x = torch.randn(2, 3, 64, 64, generator=g)
        target = torch.randint(0, 1000, (2,), generator=g)
        ref = {"input": x, "target": target}
        keys = grad_keys(model)
        model.eval()
        with torch.no_grad():
            ref["logits_eval"] = model(x)
        grads = {}
        for dtype in (torch.float32, torch.float64):
            m = build(name)
            m.load_state_dict(sd)
            m = m.to(dtype).train()
            logits = m(x.to(dtype))
            loss = torch.nn.functional.cross_entropy(logits, target)
            loss.backward()
            params = dict(m.named_parameters())
            grads[dtype] = {k: params[k].grad.detach().clone() for k in keys}
            if dtype == torch.float64:
                ref["f64.loss"] = loss.detach()
                for k in keys:
                    ref["f64.grad." + k] = grads[dtype][k]
            else:
                ref["loss32"] = loss.detach()
        f32err = {k: rel2(grads[torch.float32][k], grads[torch.float64][k]) for k in keys}
        write_safetensors(os.path.join(out, name + ".ref.safetensors"), ref,
                          {"model": name, "keys": json.dumps(keys),
                           "torch_f32_err": json.dumps(f32err),
                           "torch": torch.__version__, "torchvision": torchvision.__version__})
        print("gen: %s: %d tensors, logits max %.4g, f64 loss %.6g, torch f32 grad err max %.2e"
              % (name, len(sd), ref["logits_eval"].abs().max().item(), ref["f64.loss"].item(),
                 max(f32err.values())))
    write_shapes(out)
    with open(os.path.join(out, ".generated"), "w") as f:
        f.write(",".join(models) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["gen", "shapes"])
    ap.add_argument("--out", default=os.environ.get("LUMEN_PEER_DIR", "/tmp/lumen-peer-families"))
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    if a.mode == "shapes":
        write_shapes(a.out)
        return 0
    gen(a.out, [m for m in a.models.split(",") if m])
    return 0


if __name__ == "__main__":
    sys.exit(main())
