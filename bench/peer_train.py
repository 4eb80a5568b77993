#!/usr/bin/env python3
"""bench/peer_train.py -- the PyTorch 2.x twin of examples/train.lua (the README's main job), for
bench/train_epoch.sh: the same model, batch, optimizer, schedule and data, timed per epoch.

    python bench/peer_train.py [--epochs 12] [--batch-size 128] [--lr 0.1] [--threads 2]
        [--seed 1] [--width 16] [--blocks 1] [--limit N] [--data DIR] [--format nhwc|nchw]
        [--momentum 0.9] [--weight-decay 5e-4] [--eval-batch 500] [--quiet]

What is the same as examples/train.lua (with its defaults):
  * model: lm.models.small_resnet -- a 3x3 stem (1 -> w, no bias), batch norm, ReLU, three
    stages of torchvision BasicBlocks (w, 2w, 4w channels; strides 1, 2, 2; a 1x1 conv + batch
    norm downsample where the shape changes), adaptive average pooling, a linear classifier;
    convolutions initialised kaiming_normal_(fan_out, relu), the rest PyTorch's defaults;
    channels-last (--format nhwc) or NCHW;
  * optimizer: SGD lr 0.1, momentum 0.9, nesterov, weight decay 5e-4 on the parameters with more
    than one dimension and none on batch-norm parameters and biases (util.decay_groups);
  * schedule: util.warmup_cosine -- linear warm-up over min(steps per epoch, 200) steps, then a
    cosine to zero at epochs * steps per epoch, set before every step;
  * data: Fashion-MNIST from the same IDX files lumen reads (--data, else $LUMEN_FASHION_MNIST,
    else /usr/share/datasets/fashion-mnist), --limit N keeps the first N training and test
    images as train.lua does; batches of 128 (drop_last), a new shuffle each epoch, each sample
    padded by 2 (zero pixels), randomly cropped back to 28x28 and flipped horizontally with
    probability 1/2, normalised with mean 0.2860 and std 0.3530 (lm.data.DataLoader's options
    in train.lua). lumen's loader prepares the batches in two C worker threads while Lua
    trains; here the whole batch is gathered, cropped, flipped and normalised by a few
    vectorised torch ops in the training thread (no DataLoader worker processes on a 2-core
    machine), and that time is inside the epoch time too;
  * each step: zero_grad, cross_entropy(model(x), y), backward, step, loss.item();
  * after each epoch the test accuracy (batches of 500, eval mode, no_grad); not in the epoch
    time, as train.lua's epoch_time in its --log records.
Not the same: the shuffle and augmentation random numbers (lumen hashes (seed, epoch, position);
here torch's generator from the seed), so losses match in distribution, not bit for bit.

Prints one line per epoch:
  epoch <n> epoch_time <s> images_per_s <x> train_loss <mean> test_accuracy <fraction> data_s <s>
(data_s: the part of epoch_time spent preparing batches).
"""
import argparse
import gzip
import math
import os
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=12)
ap.add_argument("--batch-size", type=int, default=128)
ap.add_argument("--lr", type=float, default=0.1)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--width", type=int, default=16)
ap.add_argument("--blocks", type=int, default=1)
ap.add_argument("--limit", type=int, default=0)
ap.add_argument("--data", default="")
ap.add_argument("--format", default="nhwc", choices=["nhwc", "nchw"])
ap.add_argument("--momentum", type=float, default=0.9)
ap.add_argument("--weight-decay", type=float, default=5e-4)
ap.add_argument("--eval-batch", type=int, default=500)
ap.add_argument("--quiet", action="store_true")
# --amp bf16: the forward pass and the loss under torch.autocast("cpu", dtype=torch.bfloat16),
# float32 weights, gradients and optimizer (train.lua's --amp bf16); the test pass under it too
ap.add_argument("--amp", default="", choices=["", "bf16"])
opt = ap.parse_args()

torch.set_num_threads(opt.threads)
torch.manual_seed(opt.seed)
MF = torch.channels_last if opt.format == "nhwc" else torch.contiguous_format


# ---- data ---------------------------------------------------------------------------------------
def find(root, base):
    for name in (base + ".gz", base):
        p = os.path.join(root, name)
        if os.path.exists(p):
            return p
    raise SystemExit("peer_train.py: no %s in %s" % (base, root))


def read_idx(path):
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        data = f.read()
    zero, code, ndim = struct.unpack(">HBB", data[:4])
    assert zero == 0 and code == 0x08, "expected an unsigned byte IDX file: " + path
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    t = torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8)
    return t.reshape(dims)


root = opt.data or os.environ.get("LUMEN_FASHION_MNIST") or "/usr/share/datasets/fashion-mnist"
train_x = read_idx(find(root, "train-images-idx3-ubyte"))
train_y = read_idx(find(root, "train-labels-idx1-ubyte")).long()
test_x = read_idx(find(root, "t10k-images-idx3-ubyte"))
test_y = read_idx(find(root, "t10k-labels-idx1-ubyte")).long()
if opt.limit > 0:
    train_x, train_y = train_x[:opt.limit], train_y[:opt.limit]
    test_x, test_y = test_x[:opt.limit], test_y[:opt.limit]
MEAN, STD = 0.2860, 0.3530
PAD, CROP = 2, 28
# the training images padded once with zero pixels (uint8), as the loader's crop reads outside
padded = F.pad(train_x, (PAD, PAD, PAD, PAD))
N = train_x.shape[0]
B = opt.batch_size
steps_per_epoch = N // B                       # drop_last
ar = torch.arange(CROP)
rev = CROP - 1 - ar


def batch(idx, gen):
    """the augmented, normalised (B,1,28,28) float32 batch of the samples idx"""
    n = idx.numel()
    oy = torch.randint(0, 2 * PAD + 1, (n,), generator=gen)
    ox = torch.randint(0, 2 * PAD + 1, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.5
    rows = oy[:, None] + ar[None, :]                                      # (n, 28)
    cols = ox[:, None] + torch.where(flip[:, None], rev[None, :], ar[None, :])
    img = padded[idx[:, None, None], rows[:, :, None], cols[:, None, :]]  # (n, 28, 28) uint8
    x = img.unsqueeze(1).float().mul_(1.0 / (255.0 * STD)).add_(-MEAN / STD)
    return x.contiguous(memory_format=MF)


# ---- model (lumen's models/small_resnet.lua, torchvision's BasicBlock) --------------------------
class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride, downsample):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self, width=16, blocks=1, in_channels=1, num_classes=10):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(in_channels, w, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.inplanes = w

        def stage(planes, stride):
            layers = []
            for b in range(blocks):
                s = stride if b == 0 else 1
                ds = None
                if s != 1 or self.inplanes != planes:
                    ds = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, s, bias=False),
                                       nn.BatchNorm2d(planes))
                layers.append(BasicBlock(self.inplanes, planes, s, ds))
                self.inplanes = planes
            return nn.Sequential(*layers)

        self.layer1 = stage(w, 1)
        self.layer2 = stage(2 * w, 2)
        self.layer3 = stage(4 * w, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(4 * w, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


model = SmallResNet(opt.width, opt.blocks).to(memory_format=MF)
decay = [p for p in model.parameters() if p.dim() > 1]
no_decay = [p for p in model.parameters() if p.dim() <= 1]
optimizer = torch.optim.SGD([{"params": decay, "weight_decay": opt.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=opt.lr, momentum=opt.momentum, nesterov=True)
total_steps = steps_per_epoch * opt.epochs
warmup = max(1, min(steps_per_epoch, 200))


def lr_at(step):
    if step < warmup:
        return opt.lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total_steps - warmup)
    return opt.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def accuracy():
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, test_x.shape[0], opt.eval_batch):
            x = test_x[i:i + opt.eval_batch].unsqueeze(1).float()
            x = x.mul_(1.0 / (255.0 * STD)).add_(-MEAN / STD).contiguous(memory_format=MF)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=opt.amp == "bf16"):
                out = model(x)
            correct += (out.argmax(1) == test_y[i:i + opt.eval_batch]).sum().item()
    model.train()
    return correct / max(1, test_x.shape[0])


if not opt.quiet:
    print("PyTorch %s: small_resnet on Fashion-MNIST (%d train, %d test), %s, batch %d, "
          "%d epochs, %d threads" % (torch.__version__, N, test_x.shape[0], opt.format, B,
                                     opt.epochs, opt.threads), flush=True)
step = 0
model.train()
for epoch in range(1, opt.epochs + 1):
    gen = torch.Generator().manual_seed(opt.seed * 1000003 + epoch)
    order = torch.randperm(N, generator=gen)
    t0 = time.perf_counter()
    data_s = 0.0
    loss_sum = 0.0
    for b in range(steps_per_epoch):
        td = time.perf_counter()
        x = batch(order[b * B:(b + 1) * B], gen)
        y = train_y[order[b * B:(b + 1) * B]]
        data_s += time.perf_counter() - td
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=opt.amp == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item()
        step += 1
    epoch_time = time.perf_counter() - t0
    acc = accuracy()
    print("epoch %d epoch_time %.3f images_per_s %.1f train_loss %.4f test_accuracy %.4f "
          "data_s %.3f" % (epoch, epoch_time, steps_per_epoch * B / epoch_time,
                           loss_sum / max(1, steps_per_epoch), acc, data_s), flush=True)
