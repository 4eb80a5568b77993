#!/usr/bin/env python3
"""bench/cuda_peer.py -- PyTorch on the same GPU, for tools/gpu_check.sh (one process, so torch
is imported and CUDA started once).

  python3 bench/cuda_peer.py models ITERS CONFIG...
      CONFIG = MODE,FMT,BATCH,PREC (MODE infer|train, FMT nhwc|nchw, PREC amp|fp32). For each, runs
      bench/peer_models.py (a copy of ../shared/peer/bench_models.py, which does not travel to the
      GPU machine) in this process with its own arguments
          resnet50 BATCH 224 MODE FMT ITERS 2 cuda_amp|cuda
      and prints "torch resnet50 MODE FMT bBATCH PREC img/s N" (or "... error: MESSAGE").
  python3 bench/cuda_peer.py ops ITERS [BATCH] [FILTER] [DEVICE]
      the rows of bench/cuda_ops.lua, timed the same way (blocks of 10 calls ended by a
      synchronisation; median block / 10): "torch OP FMT DTYPE fwd|fwdbwd MS".
PEER_MODELS=path overrides the script run for models (tools/gpu_check.sh's local test uses it).
"""
import contextlib
import gc
import io
import os
import runpy
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def say(line):
    print(line, flush=True)


def models(iters, configs):
    script = os.environ.get("PEER_MODELS", os.path.join(HERE, "peer_models.py"))
    for cfg in configs:
        mode, fmt, bs, prec = cfg.split(",")
        tag = "torch resnet50 %s %s b%s %s" % (mode, fmt, bs, prec)
        variant = "cuda_amp" if prec == "amp" else "cuda"
        argv = [script, "resnet50", bs, "224", mode, fmt, str(iters), "2", variant]
        buf = io.StringIO()
        t0 = time.time()
        saved = sys.argv
        try:
            sys.argv = argv
            with contextlib.redirect_stdout(buf):
                runpy.run_path(script, run_name="__main__")
            out = buf.getvalue().split()
            ips = out[out.index("img/s") + 1]
            say("%s img/s %s (%.1f s with warm-ups)" % (tag, ips, time.time() - t0))
        except BaseException as e:  # SystemExit too: one config's failure must not stop the rest
            say("%s error: %s: %s" % (tag, type(e).__name__, str(e).replace("\n", " | ")[:300]))
        finally:
            sys.argv = saved
        gc.collect()
        try:
            import torch
            torch.cuda.empty_cache()
        except Exception:
            pass


OPS = [
    ("conv7x7_3_64_s2_224", (3, 224, 224), (64, 7, 2, 3), None),
    ("conv3x3_64_64_56", (64, 56, 56), (64, 3, 1, 1), None),
    ("conv1x1_256_64_56", (256, 56, 56), (64, 1, 1, 0), None),
    ("conv3x3_256_256_14", (256, 14, 14), (256, 3, 1, 1), None),
    ("conv1x1_1024_2048_s2_14", (1024, 14, 14), (2048, 1, 2, 0), None),
    ("maxpool3x3_s2_64_112", (64, 112, 112), None, "max"),
    ("adaptive_avgpool_2048_7", (2048, 7, 7), None, "adaptive_avg"),
]


def ops(reps, n, filt, device):
    import torch
    import torch.nn.functional as F
    torch.backends.cudnn.benchmark = True
    inner = 10
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def time_ms(fn):
        for _ in range(inner):
            fn()
        sync()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            sync()
            ts.append((time.perf_counter() - t0) / inner)
        ts.sort()
        return ts[reps // 2] * 1e3

    for name, (c, h, w), conv, pool in OPS:
        for dtname, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for fmt in ("nchw", "nhwc"):
                row = "%s %s %s" % (name, fmt, dtname)
                if filt and filt not in row:
                    continue
                try:
                    mf = torch.channels_last if fmt == "nhwc" else torch.contiguous_format
                    x = torch.randn(n, c, h, w).to(dt).to(device).contiguous(memory_format=mf)
                    wt = None
                    if conv:
                        co, k, s, p = conv
                        wt = (torch.randn(co, c, k, k) * 0.05).to(dt).to(device)
                        wt = wt.contiguous(memory_format=mf)
                        f = lambda xx, ww, s=s, p=p: F.conv2d(xx, ww, None, stride=s, padding=p)
                    elif pool == "max":
                        f = lambda xx, ww: F.max_pool2d(xx, 3, stride=2, padding=1)
                    else:
                        f = lambda xx, ww: F.adaptive_avg_pool2d(xx, (1, 1))
                    with torch.no_grad():
                        ms = time_ms(lambda: f(x, wt))
                    say("torch %s fwd %.4f" % (row, ms))
                    x.requires_grad_(True)
                    if wt is not None:
                        wt.requires_grad_(True)
                    g = torch.ones_like(f(x, wt).detach())

                    def fb():
                        x.grad = None
                        if wt is not None:
                            wt.grad = None
                        f(x, wt).backward(g)
                    say("torch %s fwdbwd %.4f" % (row, time_ms(fb)))
                except Exception as e:
                    say("torch %s error: %s" % (row, str(e).replace("\n", " | ")[:300]))
                x = wt = g = None
                gc.collect()


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("models", "ops"):
        sys.exit(__doc__)
    if sys.argv[1] == "models":
        models(int(sys.argv[2]), sys.argv[3:])
    else:
        a = sys.argv[3:]
        ops(int(sys.argv[2]), int(a[0]) if len(a) > 0 else 64, a[1] if len(a) > 1 else "",
            a[2] if len(a) > 2 else "cuda")


if __name__ == "__main__":
    main()
