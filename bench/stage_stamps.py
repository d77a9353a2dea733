#!/usr/bin/env python3
"""Where a latency-bound kernel's time goes, from the stage stamps of a measurement build.

A build with cmake -DMOESERVE_KERNEL_STAMPS=ON makes the instrumented CUDA kernels print one line per
CTA (src/backend/cuda/stage_stamps.cuh):

    KS <kernel> <cta> <a> <b> <c> <t_ref> <d_0> ... <d_11>

d_i: ns from the CTA's reference stamp (usually its griddepcontrol.wait) to its stage i, -1 where the
CTA did not reach it. This script groups the lines of each kernel into launches (CTAs whose reference
stamps lie within --gap-us of the launch's first), drops the first --skip launches of each kernel
(warm-up, capture), and prints per stage the median, p10 and p90 over the CTAs in us, plus the spread
of the reference stamps within a launch. --split-a / --split-c also list a stage per value of the
kernel's a / c field (e.g. the attention kernel's chunk, or whether the CTA folded).

    bench_decode ... --steps 4 > run.txt;  python3 bench/stage_stamps.py run.txt
"""
import argparse
import collections
import sys

# Stage names of the instrumented kernels (their comments in the .cu files say the same).
STAGES = {
    "attention_decode2": ["entry", "wait", "q prepared", "K/V round in smem", "rounds done", "partial fenced",
                          "arrival counted", "output (folding CTA)", "exit"],
    "gdn_decode": ["entry", "wait", "conv + gates", "l2norm, q.k", "delta rule, state stored", "cluster barrier",
                   "output written", "exit"],
    "moe_int_fused": ["entry", "wait", "routed, x quantised", "gate/up consumed", "act folded, arrival counted",
                      "past the grid-wide wait", "down acts staged", "down consumed", "combine written"],
}


def quantiles(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2], v[n // 10], v[min(n - 1, (9 * n) // 10)]


def parse(lines):
    per_kernel = collections.defaultdict(list)
    for line in lines:
        if not line.startswith("KS "):
            continue
        f = line.split()
        try:
            kernel, cta, a, b, c, t_ref = f[1], int(f[2]), int(f[3]), int(f[4]), int(f[5]), int(f[6])
            d = [int(x) for x in f[7:19]]
        except (IndexError, ValueError):
            continue  # a line cut by the printf buffer
        per_kernel[kernel].append((t_ref, cta, a, b, c, d))
    return per_kernel


def launches_of(rows, gap_ns):
    rows = sorted(rows)
    out, cur = [], []
    for r in rows:
        if cur and r[0] - cur[0][0] > gap_ns:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    return out


def report(kernel, rows, args):
    names = STAGES.get(kernel, [f"stage {i}" for i in range(12)])
    launches = launches_of(rows, args.gap_us * 1000)
    kept = launches[args.skip:]
    print(f"{kernel}: {len(launches)} launches ({len(kept)} kept), {sum(len(x) for x in kept)} CTA lines")
    if not kept:
        return
    spread = [r[0] - min(x[0] for x in ln) for ln in kept for r in ln]
    m, lo, hi = quantiles(spread)
    print(f"  {'reference stamp spread in a launch':40s} {m / 1e3:8.2f} ({lo / 1e3:.2f} - {hi / 1e3:.2f})")
    for i, name in enumerate(names):
        vals = [r[5][i] for ln in kept for r in ln if r[5][i] != -1]
        if not vals:
            continue
        m, lo, hi = quantiles(vals)
        print(f"  {i:2d} {name:37s} {m / 1e3:8.2f} ({lo / 1e3:.2f} - {hi / 1e3:.2f})  n={len(vals)}")
        for field, on in (("a", args.split_a), ("c", args.split_c)):
            if on != i:
                continue
            idx = 2 if field == "a" else 4
            by = collections.defaultdict(list)
            for ln in kept:
                for r in ln:
                    if r[5][i] != -1:
                        by[r[idx]].append(r[5][i])
            for key in sorted(by):
                m, lo, hi = quantiles(by[key])
                print(f"       {field} = {key:<6d} {'':24s} {m / 1e3:8.2f} ({lo / 1e3:.2f} - {hi / 1e3:.2f})  n={len(by[key])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", default="-", help="the run's output (default: stdin)")
    ap.add_argument("--skip", type=int, default=8, help="launches of each kernel to drop first (default 8)")
    ap.add_argument("--gap-us", type=float, default=5.0, help="reference stamps further apart start a new launch")
    ap.add_argument("--kernel", help="only this kernel")
    ap.add_argument("--split-a", type=int, default=-1, help="list this stage per value of field a")
    ap.add_argument("--split-c", type=int, default=-1, help="list this stage per value of field c")
    args = ap.parse_args()
    lines = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8", errors="replace")
    per_kernel = parse(lines)
    if not per_kernel:
        print("no KS lines: was the binary built with -DMOESERVE_KERNEL_STAMPS=ON?", file=sys.stderr)
        return 1
    for kernel in sorted(per_kernel):
        if args.kernel and kernel != args.kernel:
            continue
        report(kernel, per_kernel[kernel], args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
