#!/usr/bin/env python3
# Sums an `ncu --metrics gpu__time_duration.sum --csv` log per kernel name (and launch grid with
# --grid), divided by --div=N (the number of identical forwards profiled), largest first.
# Usage: ncu --clock-control none --metrics gpu__time_duration.sum --csv BENCH ARGS > prof.csv
#        python3 bench/ncu_kernel_sums.py prof.csv [--grid] [--div=2]
import collections
import csv
import sys

args = [a for a in sys.argv[1:] if not a.startswith('--')]
by_grid = '--grid' in sys.argv
div = 1.0
for a in sys.argv[1:]:
    if a.startswith('--div='):
        div = float(a[6:])
rows = [r for r in csv.reader(open(args[0])) if len(r) > 10]
h = rows[0]
ki, vi, ui, gi = h.index('Kernel Name'), h.index('Metric Value'), h.index('Metric Unit'), h.index('Grid Size')
scale = {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1.0, 'usecond': 1.0, 'ms': 1e3, 'msecond': 1e3}
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    try:
        v = float(r[vi].replace(',', '')) * scale[r[ui]]
    except (ValueError, KeyError):
        continue
    name = r[ki].replace('(anonymous namespace)::', '').replace('void ', '').replace('moeserve::cuda::', '')
    name = name.replace('mma_gemm_detail::', '').split('(')[0][:100]
    if by_grid:
        name += ' grid' + r[gi]
    agg[name][0] += 1
    agg[name][1] += v
tot = sum(a[1] for a in agg.values())
print(f'total {tot / 1e3 / div:.2f} ms (per forward, /{div:g})')
for n, (c, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:60]:
    print(f'{t / 1e3 / div:9.2f} ms {c / div:7.1f} x {t / c:9.1f} us  {n}')
