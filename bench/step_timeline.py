#!/usr/bin/env python3
"""Where a decode step's time goes on the GPU timeline.

A kernel's time measured alone (bench_kernels) is not its share of a step: inside the step's CUDA
graph, programmatic launches overlap a kernel's start with its predecessor's tail, the side stream
(the shared expert) overlaps the main one, and around the graph the host copies, launches, samples
and waits. This reads a kernel timeline and prints, for the steps it keeps:
  - the step's GPU span (first kernel start to last kernel end), the time some kernel runs (the
    union of the kernels' intervals), the idle time inside the span, the overlapped time; with the
    host's step calls: the host call, its launch latency (call to first kernel) and tail (last
    kernel's end to the call's return);
  - per kernel name: launches per step, mean duration, summed duration per step; exposed time: the
    part of the busy time in which it is the only kernel running (the exposed times plus the
    overlapped time make the busy time); critical time: in start order, the part of each kernel's
    interval past the latest end before it, i.e. how far it pushes the step's end (the critical
    times make the busy time; a kernel launched early that waits for its predecessor, programmatic
    dependent launch, is charged from that end, so the critical time is what a kernel adds to
    the step, where the exposed time splits overlaps away from both);
  - with --list N, the first N kernels of the median step in start order: start offset, duration,
    the gap since the latest end before it (negative: it overlapped), stream.

Inputs:
  - bench_decode --kernel-timeline FILE.csv (bench/cuda/kernel_timeline.h, CUPTI): kernels and the
    host's step calls ("step" rows); a step is the kernels that start inside one call, and each
    label (bench_decode: "batch N") is reported on its own;
  - an Nsight Systems report exported with `nsys export --type sqlite` (table
    CUPTI_ACTIVITY_KIND_KERNEL): kernels only; a step starts after an idle gap longer than
    --step-gap-us, or at each kernel matching --step-start.
Example (on the GPU machine):
  bench_decode --config bench/configs/qwen3.5-122b-a10b.json --weights hybrid-int4-fp8 --int8-lm-head \\
      --context 512 --steps 8 --prefill '' --batch 1 --kernel-timeline b1.csv
  python3 bench/step_timeline.py b1.csv --list 40
Times are printed in microseconds.
"""
import argparse
import csv
import re
import sqlite3
import statistics
import sys


def load(path):
    """(kernels, host_steps): kernels [(start_ns, end_ns, name, stream)] in start order, host steps
    [(start_ns, end_ns, label)] in start order (none from an Nsight Systems report)."""
    if path.endswith('.csv'):
        return load_csv(path)
    return load_nsys_sqlite(path), []


def load_csv(path):
    kernels, host = [], []
    with open(path, newline='') as f:
        for row in csv.DictReader(f):
            a, b = int(row['start_ns']), int(row['end_ns'])
            if row['kind'] == 'kernel':
                kernels.append((a, b, short_name(row['name']), int(row['stream'])))
            elif row['kind'] == 'step':
                host.append((a, b, row['name']))
    if not kernels:
        raise SystemExit(f'{path}: the timeline holds no kernels')
    kernels.sort()
    host.sort()
    return kernels, host


def load_nsys_sqlite(path):
    """Device 0's kernels of an nsys report (the first device seen)."""
    db = sqlite3.connect(path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if 'CUPTI_ACTIVITY_KIND_KERNEL' not in tables:
        raise SystemExit(f'{path}: no CUPTI_ACTIVITY_KIND_KERNEL table (was the report taken with --trace=cuda?)')
    cols = {r[1] for r in db.execute('PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)')}
    name_col = 'demangledName' if 'demangledName' in cols else 'shortName'
    device = 'k.deviceId' if 'deviceId' in cols else '0'
    rows = db.execute(f'SELECT k.start, k.end, s.value, k.streamId, {device} FROM CUPTI_ACTIVITY_KIND_KERNEL k '
                      f'JOIN StringIds s ON s.id = k.{name_col} ORDER BY k.start, k.end').fetchall()
    if not rows:
        raise SystemExit(f'{path}: the report holds no kernels')
    first_device = rows[0][4]
    return [(a, b, short_name(n), st) for a, b, n, st, dev in rows if dev == first_device]


def short_name(name):
    """The kernel's name without namespaces, return type and arguments; template arguments kept."""
    name = re.sub(r'\(anonymous namespace\)::', '', name)
    name = re.sub(r'\bmoeserve::cuda::(\w+::)*', '', name)
    name = re.sub(r'^void ', '', name)
    depth, out = 0, []
    for ch in name:  # drop the argument list: the first '(' outside template brackets
        if ch == '<':
            depth += 1
        elif ch == '>':
            depth -= 1
        elif ch == '(' and depth == 0:
            break
        out.append(ch)
    return ''.join(out).strip()[:110]


def split_by_gaps(kernels, gap_ns, start_re):
    """Kernels grouped into steps: a step ends where the next kernel starts more than gap_ns after every
    kernel so far has ended, or (with start_re) where the next kernel's name matches start_re."""
    steps, cur, last_end = [], [], 0
    for k in kernels:
        if cur and (start_re.search(k[2]) if start_re is not None else k[0] - last_end > gap_ns):
            steps.append(cur)
            cur, last_end = [], 0
        cur.append(k)
        last_end = max(last_end, k[1])
    if cur:
        steps.append(cur)
    return steps


def split_by_host_steps(kernels, host):
    """{label: [(host step, its kernels)]}: the kernels that start inside each host call."""
    groups, i = {}, 0
    for h in host:
        while i < len(kernels) and kernels[i][0] < h[0]:
            i += 1
        j = i
        while j < len(kernels) and kernels[j][0] <= h[1]:
            j += 1
        if j > i:
            groups.setdefault(h[2], []).append((h, kernels[i:j]))
        i = j
    return groups


def critical_times(step):
    """{name: ns}: each kernel (in start order) charged with the part of its interval past the latest
    end before it. The charges add up to the busy time (the union of the intervals)."""
    critical, frontier = {}, step[0][0]
    for a, b, name, _ in step:
        critical[name] = critical.get(name, 0) + max(0, b - max(a, frontier))
        frontier = max(frontier, b)
    return critical


def step_times(step):
    """(span, busy, exposed per name, overlapped) of one step's kernels, in ns."""
    events = []
    for i, (a, b, _, _) in enumerate(step):
        events.append((a, 1, i))
        events.append((b, -1, i))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    running, exposed, busy, overlapped, t_prev = set(), {}, 0, 0, None
    for t, kind, i in events:
        if t_prev is not None and running:
            dt = t - t_prev
            busy += dt
            if len(running) == 1:
                name = step[next(iter(running))][2]
                exposed[name] = exposed.get(name, 0) + dt
            else:
                overlapped += dt
        if kind == 1:
            running.add(i)
        else:
            running.discard(i)
        t_prev = t
    span = max(b for _, b, _, _ in step) - step[0][0]
    return span, busy, exposed, overlapped


def report(steps, host, skip, list_n, out, title=''):
    """steps: lists of kernels; host: the steps' host calls (same length) or None; the first `skip` dropped."""
    kept = steps[skip:]
    if not kept:
        raise SystemExit(f'{title}{len(steps)} steps found, none left after skipping {skip}')
    n = len(kept)
    us = 1e-3
    mean = statistics.fmean
    spans, busys, overl = [], [], []
    per_name = {}  # name -> [launches, summed duration, exposed, critical]
    for st in kept:
        span, busy, exposed, overlapped = step_times(st)
        spans.append(span)
        busys.append(busy)
        overl.append(overlapped)
        for a, b, name, _ in st:
            e = per_name.setdefault(name, [0, 0, 0, 0])
            e[0] += 1
            e[1] += b - a
        for name, t in exposed.items():
            per_name[name][2] += t
        for name, t in critical_times(st).items():
            per_name[name][3] += t
    print(f'{title}steps: {len(steps)} found, {n} kept (first {skip} skipped); kernels per step: '
          f'{mean(len(s) for s in kept):.1f}', file=out)
    print(f'step GPU span {mean(spans) * us:.2f} us (median {statistics.median(spans) * us:.2f}), busy '
          f'{mean(busys) * us:.2f}, idle inside {mean(s - b for s, b in zip(spans, busys)) * us:.2f}, '
          f'overlapped {mean(overl) * us:.2f}', file=out)
    if host:
        h = host[skip:]
        calls = [e - s for s, e, _ in h]
        launch = [st[0][0] - hs[0] for hs, st in zip(h, kept)]
        tail = [hs[1] - max(b for _, b, _, _ in st) for hs, st in zip(h, kept)]
        print(f'host call {mean(calls) * us:.2f} us: launch latency (call to first kernel) {mean(launch) * us:.2f}, '
              f'GPU span {mean(spans) * us:.2f}, tail (last kernel to return) {mean(tail) * us:.2f}', file=out)
    else:
        gaps = [steps[skip + i + 1][0][0] - max(b for _, b, _, _ in st)
                for i, st in enumerate(kept) if skip + i + 1 < len(steps)]
        if gaps:
            print(f'gap to the next step (host: sampling, copies, launch) {mean(gaps) * us:.2f} us '
                  f'(over {len(gaps)} steps)', file=out)
    print(f'\n{"per step":>9} {"launches":>8} {"mean us":>9} {"sum us":>9} {"exposed us":>10} {"critical us":>11}'
          f'  kernel', file=out)
    for name, (cnt, tot, exp, crit) in sorted(per_name.items(), key=lambda kv: (-kv[1][3], -kv[1][2])):
        print(f'{"":9} {cnt / n:8.1f} {tot / cnt * us:9.2f} {tot / n * us:9.2f} {exp / n * us:10.2f} '
              f'{crit / n * us:11.2f}  {name}', file=out)
    if list_n:
        order = sorted(range(n), key=lambda i: spans[i])
        st = kept[order[n // 2]]
        t0 = st[0][0]
        print(f'\nthe median step\'s first {min(list_n, len(st))} kernels (us from its start):', file=out)
        print(f'{"start":>9} {"dur":>8} {"gap":>8} {"stream":>6}  kernel', file=out)
        latest = None
        for a, b, name, stream in st[:list_n]:
            gap = 0 if latest is None else a - latest
            print(f'{(a - t0) * us:9.2f} {(b - a) * us:8.2f} {gap * us:8.2f} {stream:6}  {name}', file=out)
            latest = b if latest is None else max(latest, b)


def main(argv=None, out=sys.stdout):
    """Parses argv and prints the report to out; returns {label: steps}."""
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('timeline', help='bench_decode --kernel-timeline CSV, or an nsys report exported as sqlite')
    p.add_argument('--step-gap-us', type=float, default=20.0,
                   help='without host steps: an idle gap longer than this starts a new step (default 20)')
    p.add_argument('--step-start', default=None,
                   help='regex: a kernel whose name matches starts a step (host steps are then ignored)')
    p.add_argument('--label', default=None, help='report only the host steps with this label (e.g. "batch 1")')
    p.add_argument('--skip', type=int, default=1, help='leading steps to drop (default 1)')
    p.add_argument('--list', type=int, default=0, metavar='N', help="print the median step's first N kernels")
    a = p.parse_args(argv)
    kernels, host = load(a.timeline)
    if host and a.step_start is None:
        groups = split_by_host_steps(kernels, host)
        if a.label is not None:
            if a.label not in groups:
                raise SystemExit(f'{a.timeline}: no steps labelled {a.label!r} (labels: {", ".join(groups)})')
            groups = {a.label: groups[a.label]}
        result = {}
        for i, (label, pairs) in enumerate(groups.items()):
            if i:
                print(file=out)
            report([k for _, k in pairs], [h for h, _ in pairs], a.skip, a.list, out, f'[{label}] ')
            result[label] = [k for _, k in pairs]
        return result
    start_re = re.compile(a.step_start) if a.step_start else None
    steps = split_by_gaps(kernels, a.step_gap_us * 1e3, start_re)
    report(steps, None, a.skip, a.list, out)
    return {'': steps}


if __name__ == '__main__':
    main()
