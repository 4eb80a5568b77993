#!/usr/bin/env python3
"""tools/ci_coverage.py -- which C lines each spec file runs, to choose .ci/asan*.exclude.

The ASan stages of .ci/run check the C code (and, on the emulated CUDA device, the CUDA kernel
bodies compiled as host C++). A spec file whose run reaches no C line that the other files of
the stage do not reach adds nothing to that stage but time. This tool measures it:

  1. a --coverage build of the library (and of the emulated CUDA library with --device cuda:0)
     into build-cov/ (-O2: the lines reached are the same as at the ASan build's -O1, and
     -O1's counter updates in every inner loop ran some files 25 times slower);
  2. every spec file of the stage in its own busted process (and, on the host, every C program
     of spec/c/), each with GCOV_PREFIX pointing at its own directory, timed;
  3. gcov's JSON per unit: the set of (source, line) it executed;
  4. greedily, longest unit first: a unit is left out when the units still kept reach every line
     that all of them together reach; the list printed is the one to put in the exclude file.

  python3 tools/ci_coverage.py                 # the host stage (make asan)
  python3 tools/ci_coverage.py --device cuda:0 # the emulated CUDA stage (make asan-cuda-emu)
  options: --out DIR (default /tmp/lumen-cov-<stage>), --min-seconds S (only units longer than
  S are candidates, default 3), --reuse (skip steps 1-2: analyse an earlier --out)

Lines only (not branches or values): a file left out may still run a reached line with other
sizes. The exclude files say so.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = "build-cov"
OBJ_DIRS = ["src", "src/ops", "kernels/cpu", "kernels/sim", "emu/kernels/cuda"]


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, check=True, cwd=ROOT, **kw)


def device_skipped(device):
    """the spec files tools/run_tests.sh skips on a test device (device_skip, cuda_skip)"""
    text = open(os.path.join(ROOT, "tools/run_tests.sh")).read()
    out = set()
    for arr in ("device_skip", "cuda_skip"):
        if arr == "cuda_skip" and not device.startswith("cuda"):
            continue
        m = re.search(r"^%s=\((.*?)^\)" % arr, text, re.S | re.M)
        for line in m.group(1).splitlines():
            f = line.split("#")[0].strip()
            if f:
                out.add(f)
    return out


def build(device):
    flags = '-O2 -g --coverage -Wno-error'
    sh(f'make -j2 BUILD={BUILD} OPT="{flags}" LDFLAGS="--coverage" '
       f'{BUILD}/liblumen.so lua/lumen/cdef.lua', stdout=subprocess.DEVNULL)
    if device:
        sh(f'make -j2 BUILD={BUILD} CUDA_EMU_FLAGS="--coverage" {BUILD}/liblumen_cuda_emu.so',
           stdout=subprocess.DEVNULL)


def units(device):
    specs = sorted(glob.glob("spec/**/*_spec.lua", root_dir=ROOT, recursive=True))
    if device:
        skip = device_skipped(device)
        return [("spec", s) for s in specs if s not in skip]
    return [("spec", s) for s in specs] + \
        [("c", c) for c in sorted(glob.glob("spec/c/*.c", root_dir=ROOT))]


def run_units(args, todo):
    lib = os.path.join(ROOT, BUILD, "liblumen.so")
    strip = len([p for p in ROOT.split("/") if p])
    times = {}
    for kind, name in todo:
        uid = name.replace("/", "_")
        prefix = os.path.join(args.out, "units", uid)
        os.makedirs(prefix, exist_ok=True)
        # one thread: gcov's counters are plain memory, and two threads bumping the same ones
        # in a parallel loop run some files 10-30 times slower (amp_spec.lua: 56 s)
        env = dict(os.environ, LUMEN_LIB=lib, GCOV_PREFIX=prefix, GCOV_PREFIX_STRIP=str(strip),
                   OMP_NUM_THREADS="1")
        if args.device:
            env.update(LUMEN_DEFAULT_DEVICE=args.device,
                       LUMEN_CUDA_LIB=os.path.join(ROOT, BUILD, "liblumen_cuda_emu.so"))
        t0 = time.time()
        if kind == "spec":
            cmd = ["luajit", "/usr/bin/busted", "--ignore-lua", name]
        else:
            exe = os.path.join(ROOT, BUILD, "spec_c", os.path.basename(name)[:-2])
            os.makedirs(os.path.dirname(exe), exist_ok=True)
            subprocess.run(["cc", "-std=c11", "-g", "-O1", "-Isrc", "-o", exe, name,
                            "-L" + BUILD, "-llumen", "-Wl,-rpath," + os.path.join(ROOT, BUILD),
                            "-lm", "-fopenmp"], cwd=ROOT, check=True)
            cmd = [exe]
        r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        times[name] = time.time() - t0
        tail = r.stdout.strip().splitlines()[-1:] or ["(no output)"]
        print(f"{times[name]:7.1f} s  {name}: {tail[0][:90]}", flush=True)
    json.dump(times, open(os.path.join(args.out, "times.json"), "w"), indent=1)
    return times


def lines_of(args, name):
    """the (source, line) pairs a unit executed, from gcov's JSON"""
    uid = name.replace("/", "_")
    base = os.path.join(args.out, "units", uid, BUILD)
    seen = set()
    for d in OBJ_DIRS:
        gdir = os.path.join(base, d)
        gcdas = sorted(glob.glob(os.path.join(gdir, "*.gcda")))
        if not gcdas:
            continue
        for g in gcdas:        # gcov wants the .gcno beside the .gcda
            gcno = os.path.join(ROOT, BUILD, d, os.path.basename(g)[:-5] + ".gcno")
            link = g[:-5] + ".gcno"
            if not os.path.exists(link):
                os.symlink(gcno, link)
        r = subprocess.run(["gcov", "--json-format", "--stdout", "-o", gdir] + gcdas,
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
        for doc in r.stdout.splitlines():
            doc = doc.strip()
            if not doc.startswith("{"):
                continue
            for f in json.loads(doc).get("files", []):
                src = f["file"]
                for ln in f.get("lines", []):
                    if ln.get("count", 0) > 0:
                        seen.add((src, ln["line_number"]))
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--min-seconds", type=float, default=3.0)
    ap.add_argument("--reuse", action="store_true")
    args = ap.parse_args()
    stage = "asan-cuda-emu" if args.device else "asan"
    args.out = os.path.abspath(args.out or f"/tmp/lumen-cov-{stage}")
    todo = units(args.device)
    if args.reuse:
        times = json.load(open(os.path.join(args.out, "times.json")))
    else:
        sh(f"rm -rf {args.out}")
        os.makedirs(args.out)
        build(args.device)
        times = run_units(args, todo)
    cover = {name: lines_of(args, name) for _, name in todo}
    total = set().union(*cover.values())
    print(f"\n{stage}: {len(todo)} units, {len(total)} C lines reached in all, "
          f"{sum(times.values()):.0f} s")
    kept = {name for _, name in todo}
    left_out = []
    for name in sorted(kept, key=lambda n: -times.get(n, 0)):
        if times.get(name, 0) < args.min_seconds:
            continue
        rest = set().union(*(cover[n] for n in kept if n != name))
        if total <= rest:
            kept.discard(name)
            left_out.append(name)
            print(f"leave out {name} ({times[name]:.1f} s, {len(cover[name])} lines, "
                  f"all reached by the others)")
        else:
            print(f"keep      {name} ({times[name]:.1f} s): {len(cover[name] - rest)} lines "
                  f"only it reaches, e.g. {sorted(cover[name] - rest)[:3]}")
    saved = sum(times[n] for n in left_out)
    print(f"\n{len(left_out)} units left out, {saved:.0f} of {sum(times.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
