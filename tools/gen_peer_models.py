#!/usr/bin/python3
"""The PyTorch side of `make check-peer`: torchvision models, their weights and reference results
for lumen's spec/peer/models_spec.lua, and a check of the safetensors file lumen writes back.

    /usr/bin/python3 tools/gen_peer_models.py gen    [--out /tmp/lumen-peer]
    /usr/bin/python3 tools/gen_peer_models.py verify [--out /tmp/lumen-peer]

gen, for resnet50, alexnet and resnext50_32x4d (torchvision's constructors, random weights from a
fixed seed; batch-norm running statistics calibrated on a few random batches so that eval mode
sees realistic statistics; AlexNet built with dropout=0 so that a training step is
deterministic), writes into --out:

  <model>.weights.safetensors   the state_dict (torchvision key names)
  <model>.ref.safetensors       input (2x3x64x64), target (0-based), logits_eval, and for ONE
                                training step (train mode, cross entropy, SGD lr=0.01
                                momentum=0.9 weight_decay=1e-4): logits_train, loss,
                                grad.<key> for a few parameters, new.<key> (those parameters
                                after the step) and buffer.<key> for every buffer after the
                                training forward (updated running statistics); the same again
                                computed in float64 under the prefix "f64."

verify reads <out>/lumen_out.safetensors, written by spec/peer/models_spec.lua, with the reader
below (written from the format description, independent of lumen's) and checks it: every dtype,
a channels-last tensor stored in logical order, and lumen's logits against PyTorch's.

The `safetensors` Python package is not needed: files are written and read here with struct and
json, following https://github.com/huggingface/safetensors (8-byte little-endian header size,
JSON header, row-major data, offsets relative to the end of the header, the data fully covered).
"""
import argparse
import json
import os
import struct
import sys

import torch
import torchvision

MODELS = ["resnet50", "alexnet", "resnext50_32x4d"]
SEED = 20240601

CODE = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
        torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8",
        torch.bool: "BOOL"}
DTYPE = {v: k for k, v in CODE.items()}


# ---------------------------------------------------------------------------------------------
# safetensors, by hand

def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    names = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, off = {}, 0
    blobs = []
    for n in names:
        b = tensor_bytes(tensors[n])
        header[n] = {"dtype": CODE[tensors[n].dtype], "shape": list(tensors[n].shape),
                     "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    """A strict reader: returns (dict name -> tensor, metadata). Raises ValueError."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("file too small")
    (n,) = struct.unpack("<Q", data[:8])
    if n > 100 * 1024 * 1024 or 8 + n > len(data):
        raise ValueError("bad header length %d" % n)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    meta = header.pop("__metadata__", None) or {}
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError("metadata must map strings to strings")
    body = data[8 + n:]
    spans = []
    out = {}
    for name, e in header.items():
        dt = DTYPE[e["dtype"]]
        shape = e["shape"]
        b, end = e["data_offsets"]
        numel = 1
        for s in shape:
            numel *= s
        esize = torch.tensor([], dtype=dt).element_size()
        if end - b != numel * esize:
            raise ValueError("%s: offsets do not match shape and dtype" % name)
        spans.append((b, end, name))
        raw = bytes(body[b:end])
        if dt == torch.bfloat16:
            t = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16) \
                if raw else torch.zeros(0, dtype=dt)
        else:
            t = torch.frombuffer(bytearray(raw), dtype=dt) if raw else torch.zeros(0, dtype=dt)
        out[name] = t.reshape(shape).clone()
    spans.sort()
    pos = 0
    for b, end, name in spans:
        if b != pos:
            raise ValueError("%s: data not contiguous (offset %d, expected %d)" % (name, b, pos))
        pos = end
    if pos != len(body):
        raise ValueError("data section has %d bytes, tensors use %d" % (len(body), pos))
    return out, meta


# ---------------------------------------------------------------------------------------------
# gen

def build(name):
    if name == "alexnet":
        return torchvision.models.alexnet(dropout=0.0)
    return getattr(torchvision.models, name)()


def calibrate(model, gen):
    """Running statistics from a few random batches (cumulative average)."""
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


def grad_keys(name, model):
    if name == "alexnet":
        # (the large classifier.1 / classifier.4 weights are left out to keep the files small)
        return ["features.0.weight", "features.0.bias", "features.3.weight", "features.10.weight",
                "features.10.bias", "classifier.1.bias", "classifier.4.bias",
                "classifier.6.weight", "classifier.6.bias"]
    return ["conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
            "layer1.0.conv2.weight", "layer2.0.downsample.0.weight", "layer3.1.conv2.weight",
            "layer4.2.conv3.weight", "layer4.2.bn3.weight", "fc.weight", "fc.bias"]


def gen(out):
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for name in MODELS:
        torch.manual_seed(SEED)
        g = torch.Generator().manual_seed(SEED + 1)
        model = build(name)
        calibrate(model, g)
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        write_safetensors(os.path.join(out, name + ".weights.safetensors"), sd,
                          {"format": "pt", "model": name})
        x = torch.randn(2, 3, 64, 64, generator=g)
        target = torch.randint(0, 1000, (2,), generator=g)
        ref = {"input": x, "target": target}
        keys = grad_keys(name, model)
        # float32 (the acceptance dtype), then float64 (an exact check of the arithmetic: a
        # training step through batch norm on a batch of 2 is ill-conditioned, PyTorch's own
        # float32 gradients differ from its float64 ones by ~1e-2 in the early layers)
        for prefix, dtype in (("", torch.float32), ("f64.", torch.float64)):
            m = build(name)
            m.load_state_dict(sd)
            m = m.to(dtype)
            xd = x.to(dtype)
            m.eval()
            with torch.no_grad():
                ref[prefix + "logits_eval"] = m(xd)
            m.train()
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
            opt.zero_grad()
            logits = m(xd)
            loss = torch.nn.functional.cross_entropy(logits, target)
            loss.backward()
            ref[prefix + "logits_train"] = logits.detach()
            ref[prefix + "loss"] = loss.detach()
            params = dict(m.named_parameters())
            for k in keys:
                ref[prefix + "grad." + k] = params[k].grad.detach().clone()
            for k, b in m.named_buffers():
                ref[prefix + "buffer." + k] = b.detach().clone()
            opt.step()
            for k in keys:
                ref[prefix + "new." + k] = params[k].detach().clone()
            if prefix == "":
                loss32 = loss.item()
        write_safetensors(os.path.join(out, name + ".ref.safetensors"), ref,
                          {"model": name, "keys": json.dumps(keys), "lr": "0.01",
                           "momentum": "0.9", "weight_decay": "1e-4",
                           "torch": torch.__version__, "torchvision": torchvision.__version__})
        print("gen: %s: %d tensors, logits max %.4g, loss %.6g" % (
            name, len(sd), ref["logits_eval"].abs().max().item(), loss32))
    # the file lumen must read back in the peer spec: every dtype, written by this writer
    vals = {
        "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
        "f64": torch.tensor([1 / 3, -2.5, 1e300], dtype=torch.float64),
        "f16": torch.tensor([0.5, -1.25, 65504.0], dtype=torch.float16),
        "bf16": torch.tensor([1.0, -2.5, 3.0e38], dtype=torch.bfloat16),
        "i64": torch.tensor([1, -(2 ** 62)], dtype=torch.int64),
        "i32": torch.tensor([7, -8, 2 ** 31 - 1], dtype=torch.int32),
        "u8": torch.tensor([0, 1, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True], dtype=torch.bool),
    }
    write_safetensors(os.path.join(out, "python_dtypes.safetensors"), vals, {"writer": "python"})


# ---------------------------------------------------------------------------------------------
# verify

def rel_err(a, b):
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    if scale == 0:
        scale = 1.0
    return (a - b).abs().max().item() / scale


def verify(out):
    path = os.path.join(out, "lumen_out.safetensors")
    if not os.path.exists(path):
        print("verify: %s is missing (run spec/peer/models_spec.lua first)" % path)
        return 1
    t, meta = read_safetensors(path)
    failures = []

    def check(cond, what):
        print("verify: %-60s %s" % (what, "ok" if cond else "FAILED"))
        if not cond:
            failures.append(what)

    # every dtype, with the values the spec wrote (arange-based)
    exp = {
        "dt_f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
        "dt_f64": torch.tensor([1 / 3, -2.5, 1e300], dtype=torch.float64),
        "dt_f16": torch.tensor([0.5, -1.25, 65504.0], dtype=torch.float16),
        "dt_bf16": torch.tensor([1.0, -2.5, 3.0e38], dtype=torch.bfloat16),
        "dt_i64": torch.tensor([1, -(2 ** 62)], dtype=torch.int64),
        "dt_i32": torch.tensor([7, -8, 2 ** 31 - 1], dtype=torch.int32),
        "dt_u8": torch.tensor([0, 1, 255], dtype=torch.uint8),
        "dt_bool": torch.tensor([True, False, True], dtype=torch.bool),
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }
    for k, v in exp.items():
        check(k in t and t[k].dtype == v.dtype and t[k].shape == v.shape and
              torch.equal(t[k], v), "dtype/value %s (%s)" % (k, CODE[v.dtype]))
    # a channels-last tensor is stored in logical (NCHW row-major) order
    cl = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    check("cl" in t and torch.equal(t["cl"], cl), "channels-last tensor in logical order")
    fm = json.loads(meta.get("lumen.memory_formats", "{}"))
    check(fm.get("cl") == "channels_last", "lumen.memory_formats records 'cl'")
    # lumen's logits against PyTorch's
    for name in MODELS:
        refp = os.path.join(out, name + ".ref.safetensors")
        if not os.path.exists(refp):
            continue
        ref, _ = read_safetensors(refp)
        for fmt in ("nchw", "cl"):
            k = "%s.logits_eval.%s" % (name, fmt)
            if k in t:
                e = rel_err(t[k], ref["logits_eval"])
                check(e <= 1e-4, "%s eval logits (%s), rel err %.2e" % (name, fmt, e))
    if failures:
        print("verify: %d check(s) FAILED" % len(failures))
        return 1
    print("verify: all %d tensors of lumen_out.safetensors read and checked" % len(t))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["gen", "verify"])
    ap.add_argument("--out", default=os.environ.get("LUMEN_PEER_DIR", "/tmp/lumen-peer"))
    a = ap.parse_args()
    if a.mode == "gen":
        gen(a.out)
        return 0
    return verify(a.out)


if __name__ == "__main__":
    sys.exit(main())
