#!/usr/bin/env python3
"""bench/step_timeline.py on timelines built here (an nsys sqlite report, a bench_decode CSV): steps of
four kernels whose overlaps, idle gap and host gaps are known, so every printed number has a value to
equal."""
import csv
import io
import os
import sqlite3
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'bench'))
import step_timeline as tl  # noqa: E402

US = 1000  # ns

# One step (us from its start): A [0, 10] and B [8, 20] overlap for 2; C [12, 15] on the side stream
# runs inside B; D [22, 30] follows an idle gap of 2. Steps start every 100 us: the host gap is 70.
STEP = [(0, 10, 'void moeserve::cuda::(anonymous namespace)::norm_kernel<float>(float const*, int)', 7),
        (8, 20, 'void moeserve::cuda::moe_int_detail::gemv<4, true>(Jobs)', 7),
        (12, 15, 'shared_down(float*)', 9),
        (22, 30, 'lm_head(int)', 7)]


def make_report(path, steps=3, period=100):
    db = sqlite3.connect(path)
    db.execute('CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)')
    db.execute('CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,'
               ' streamId INT NOT NULL, shortName INT NOT NULL, demangledName INT NOT NULL)')
    names = {}
    for _, _, n, _ in STEP:
        names[n] = len(names) + 1
        db.execute('INSERT INTO StringIds VALUES (?, ?)', (names[n], n))
    db.execute('INSERT INTO StringIds VALUES (?, ?)', (99, 'short'))
    for s in range(steps):
        for a, b, n, st in STEP:
            t0 = s * period
            db.execute('INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, 99, ?)',
                       ((t0 + a) * US, (t0 + b) * US, st, names[n]))
    # A second device's kernel: ignored.
    db.execute('INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 1, 7, 99, ?)', (5 * US, 6 * US, 1))
    db.commit()
    db.close()


class TimelineFileTest(unittest.TestCase):
    """A timeline file written by `make` into a fresh folder, as self.path."""
    file_name, make = None, None

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, self.file_name)
        type(self).make(self.path)

    def tearDown(self):
        self.dir.cleanup()


class NsysStepTimelineTest(TimelineFileTest):
    file_name, make = 'r.sqlite', make_report

    def run_tool(self, *args):
        out = io.StringIO()
        steps = tl.main([self.path, *args], out)['']
        return steps, out.getvalue()

    @staticmethod
    def kernel_rows(text):
        """{name: [launches per step, mean us, sum us per step, exposed us, critical us per step]} of the table."""
        rows = {}
        for line in text.splitlines():
            f = line.split()
            if line.startswith(' ' * 9) and f and f[0] != 'launches':
                rows[' '.join(f[5:])] = [float(v) for v in f[:5]]
        return rows

    def test_short_names(self):
        self.assertEqual(tl.short_name(STEP[0][2]), 'norm_kernel<float>')
        self.assertEqual(tl.short_name(STEP[1][2]), 'gemv<4, true>')
        self.assertEqual(tl.short_name('shared_down(float*)'), 'shared_down')

    def test_steps_split_at_idle_gaps(self):
        steps, text = self.run_tool('--skip', '0')
        self.assertEqual([len(s) for s in steps], [4, 4, 4])  # the 2 us gap inside a step does not split it
        self.assertIn('steps: 3 found, 3 kept (first 0 skipped); kernels per step: 4.0', text)
        self.assertIn('step GPU span 30.00 us (median 30.00), busy 28.00, idle inside 2.00, overlapped 5.00', text)
        self.assertIn('gap to the next step (host: sampling, copies, launch) 70.00 us (over 2 steps)', text)

    def test_exposed_time_per_kernel(self):
        _, text = self.run_tool()
        rows = self.kernel_rows(text)
        # Exposed: alone; critical: past the latest end before it (B from A's end at 10, C none: inside B,
        # D from its start at 22: the idle gap is no kernel's).
        self.assertEqual(rows['norm_kernel<float>'], [1.0, 10.0, 10.0, 8.0, 10.0])   # [0, 8] alone
        self.assertEqual(rows['gemv<4, true>'], [1.0, 12.0, 12.0, 7.0, 10.0])        # [10, 12] + [15, 20]
        self.assertEqual(rows['shared_down'], [1.0, 3.0, 3.0, 0.0, 0.0])             # inside B
        self.assertEqual(rows['lm_head'], [1.0, 8.0, 8.0, 8.0, 8.0])
        exposed = sum(r[3] for r in rows.values())
        self.assertEqual(exposed + 5.0, 28.0)  # exposed + overlapped = busy
        self.assertEqual(sum(r[4] for r in rows.values()), 28.0)  # the critical times make the busy time
        self.assertIn('steps: 3 found, 2 kept (first 1 skipped)', text)
        # Largest critical first (ties: largest exposed first).
        self.assertEqual(list(rows), ['norm_kernel<float>', 'gemv<4, true>', 'lm_head', 'shared_down'])

    def test_critical_time_charges_an_early_launch_from_its_predecessors_end(self):
        # P [0, 10]; Q launched at 2 (programmatic), waits, ends at 14; R [3, 5] on a side stream.
        step = [(0, 10, 'p', 7), (2, 14, 'q', 7), (3, 5, 'r', 9)]
        self.assertEqual(tl.critical_times(step), {'p': 10, 'q': 4, 'r': 0})

    def test_step_start_regex_and_listing(self):
        steps, text = self.run_tool('--step-start', '^lm_head', '--skip', '0', '--list', '4')
        # Each lm_head starts a step: the first holds A, B, C; the later ones lm_head, A, B, C.
        self.assertEqual([len(s) for s in steps], [3, 4, 4, 1])
        listing = text.split("the median step's first")[1].splitlines()[2:]
        self.assertEqual(len(listing), 4)
        fields = [line.split() for line in listing]
        # Spans 20, 98, 98, 8: the median step (98 us) is the previous step's lm_head, then A, B, C.
        self.assertEqual([f[4] for f in fields], ['lm_head', 'norm_kernel<float>', 'gemv<4,', 'shared_down'])
        self.assertEqual([float(f[0]) for f in fields], [0.0, 78.0, 86.0, 90.0])
        self.assertEqual([float(f[2]) for f in fields], [0.0, 70.0, -2.0, -8.0])
        self.assertEqual([f[3] for f in fields], ['7', '7', '7', '9'])

    def test_missing_table_is_a_clear_error(self):
        empty = os.path.join(self.dir.name, 'empty.sqlite')
        sqlite3.connect(empty).close()
        with self.assertRaises(SystemExit) as cm:
            tl.load(empty)
        self.assertIn('no CUPTI_ACTIVITY_KIND_KERNEL table', str(cm.exception))


def write_csv(path):
    """Three host steps "batch 1" (us 1000, 1100, 1200; each call 40 us) whose kernels are STEP shifted
    by 5 us, two "batch 8" steps (2000, 2100) of one 50 us kernel, and warm-up kernels outside every call."""
    with open(path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['kind', 'start_ns', 'end_ns', 'stream', 'graph_node', 'name'])
        w.writerow(['kernel', 10 * US, 20 * US, 7, 0, 'warmup(int)'])
        for s in range(3):
            t0 = 1000 + 100 * s
            w.writerow(['step', t0 * US, (t0 + 40) * US, 0, 0, 'batch 1'])
            for a, b, n, st in STEP:
                w.writerow(['kernel', (t0 + 5 + a) * US, (t0 + 5 + b) * US, st, 3, n])
        for s in range(2):
            t0 = 2000 + 100 * s
            w.writerow(['step', t0 * US, (t0 + 60) * US, 0, 0, 'batch 8'])
            w.writerow(['kernel', (t0 + 4) * US, (t0 + 54) * US, 7, 4, 'void big<8, float>(int, "q")'])
        w.writerow(['kernel', 3000 * US, 3001 * US, 7, 0, 'after(int)'])


class StepTimelineCsvTest(TimelineFileTest):
    file_name, make = 't.csv', write_csv

    def test_host_steps_split_by_label(self):
        out = io.StringIO()
        groups = tl.main([self.path], out)
        text = out.getvalue()
        self.assertEqual(list(groups), ['batch 1', 'batch 8'])
        self.assertEqual([len(s) for s in groups['batch 1']], [4, 4, 4])  # warm-up and later kernels left out
        self.assertEqual([len(s) for s in groups['batch 8']], [1, 1])
        self.assertIn('[batch 1] steps: 3 found, 2 kept (first 1 skipped); kernels per step: 4.0', text)
        self.assertIn('step GPU span 30.00 us (median 30.00), busy 28.00, idle inside 2.00, overlapped 5.00', text)
        self.assertIn('host call 40.00 us: launch latency (call to first kernel) 5.00, GPU span 30.00, '
                      'tail (last kernel to return) 5.00', text)
        self.assertIn('[batch 8] steps: 2 found, 1 kept', text)
        self.assertIn('host call 60.00 us: launch latency (call to first kernel) 4.00, GPU span 50.00, '
                      'tail (last kernel to return) 6.00', text)
        self.assertIn('50.00  big<8, float>', text)  # the quoted name with commas survives the CSV

    def test_label_selects_and_unknown_label_is_an_error(self):
        out = io.StringIO()
        groups = tl.main([self.path, '--label', 'batch 8', '--skip', '0'], out)
        self.assertEqual(list(groups), ['batch 8'])
        self.assertNotIn('[batch 1]', out.getvalue())
        with self.assertRaises(SystemExit) as cm:
            tl.main([self.path, '--label', 'batch 2'], io.StringIO())
        self.assertIn("no steps labelled 'batch 2' (labels: batch 1, batch 8)", str(cm.exception))


if __name__ == '__main__':
    unittest.main()
