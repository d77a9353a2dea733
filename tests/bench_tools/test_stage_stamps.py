#!/usr/bin/env python3
"""bench/stage_stamps.py on stamp lines built here: launches whose stage times are known, so every
printed number has a value to equal."""
import os
import subprocess
import sys
import tempfile
import unittest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'bench')
sys.path.insert(0, BENCH)
import stage_stamps as ss  # noqa: E402


def line(kernel, cta, a, b, c, t_ref, stages):
    d = list(stages) + [-1] * (12 - len(stages))
    return 'KS %s %d %d %d %d %d %s\n' % (kernel, cta, a, b, c, t_ref, ' '.join(str(x) for x in d))


def run_lines(launches=4, ctas=10):
    """gdn_decode launches 100 us apart; CTA i of a launch: wait 20·i ns after the first, entry 3 us
    before its wait, conv done at 1 + 0.1·i us, exit at 5 us; one CTA never reaches the barrier."""
    out = []
    for ln in range(launches):
        base = 1_000_000 + ln * 100_000
        for i in range(ctas):
            t = base + 20 * i
            barrier = -1 if i == ctas - 1 else 4000
            out.append(line('gdn_decode', i, i % 2, 0, 0, t, [-3000, 0, 1000 + 100 * i, 2000, 3000, barrier, 4500, 5000]))
    out.append('noise that is not a stamp line\n')
    out.append('KS gdn_decode 1 2\n')  # cut by the printf buffer: skipped
    return out


class StageStampsTest(unittest.TestCase):
    def test_parse_and_launches(self):
        per = ss.parse(run_lines())
        self.assertEqual(list(per), ['gdn_decode'])
        self.assertEqual(len(per['gdn_decode']), 40)
        launches = ss.launches_of(per['gdn_decode'], 5000)
        self.assertEqual([len(x) for x in launches], [10, 10, 10, 10])
        self.assertEqual(ss.quantiles([5, 1, 3, 2, 4]), (3, 1, 5))

    def report(self, *args):
        with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as f:
            f.writelines(run_lines())
            path = f.name
        try:
            r = subprocess.run([sys.executable, os.path.join(BENCH, 'stage_stamps.py'), path, *args],
                               capture_output=True, text=True, check=True)
        finally:
            os.unlink(path)
        return r.stdout.splitlines()

    def stage(self, out, name):
        row = [x for x in out if name in x]
        self.assertEqual(len(row), 1, out)
        return row[0]

    def test_report(self):
        out = self.report('--skip', '1', '--split-a', '2')
        self.assertEqual(out[0], 'gdn_decode: 4 launches (3 kept), 30 CTA lines')
        # Reference stamps 0, 20, ..., 180 ns after the launch's first: median 100, p10 20, p90 180.
        self.assertIn('0.10 (0.02 - 0.18)', self.stage(out, 'reference stamp spread'))
        self.assertIn('-3.00 (-3.00 - -3.00)  n=30', self.stage(out, ' 0 entry'))
        # conv: 1.0 + 0.1·i us over i = 0..9 (3 launches): median i = 5, p10 i = 1, p90 i = 9.
        self.assertIn('1.50 (1.10 - 1.90)  n=30', self.stage(out, 'conv + gates'))
        # the barrier: the last CTA of each launch never got there.
        self.assertIn('4.00 (4.00 - 4.00)  n=27', self.stage(out, 'cluster barrier'))
        # split by a (CTA parity): even CTAs 1.0, 1.2, ..., 1.8; odd 1.1, ..., 1.9.
        self.assertTrue(any('a = 0' in x and '1.40 (1.00 - 1.80)  n=15' in x for x in out), out)
        self.assertTrue(any('a = 1' in x and '1.50 (1.10 - 1.90)  n=15' in x for x in out), out)

    def test_no_lines(self):
        with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as f:
            f.write('nothing here\n')
            path = f.name
        try:
            r = subprocess.run([sys.executable, os.path.join(BENCH, 'stage_stamps.py'), path],
                               capture_output=True, text=True)
        finally:
            os.unlink(path)
        self.assertEqual(r.returncode, 1)
        self.assertIn('MOESERVE_KERNEL_STAMPS', r.stderr)


if __name__ == '__main__':
    unittest.main()
