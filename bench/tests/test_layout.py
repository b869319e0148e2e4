"""The results layout (bench/ferrybench/layout.py): every suite's run
directory gets summary.json, results.md and raw/, and the stored results
follow it.

    python3 -m unittest discover -s bench/tests     # well under a second

Nothing here runs a benchmark: the shell suites' and the soaks' outputs are
built from JSON shaped like theirs, the DERP suite's by --rerender of
stored raw reports.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from ferrybench import layout  # noqa: E402

# One raw document per shell suite and the soak, shaped as each writes it
# (the fields that matter here; the stored results have the rest).
RAW = {
    "udp": [{"relay": "ferry", "repeat": 1, "tcp_mbits": 1700.0, "pps_1400": 116000},
            {"relay": "ferry", "repeat": 2, "tcp_mbits": 1800.0, "pps_1400": 118000},
            {"relay": "socat", "repeat": 1, "tcp_mbits": 900.0, "pps_1400": 50000}],
    "pps": [{"relay": "ferry", "case": "bounce", "pps": 900000, "sink": {"packets": 1}},
            {"relay": "ferry", "case": "hub", "pps": 800000, "sink": {"packets": 1}}],
    "tunnel": [{"Relay": "ferry-tls", "Repeat": 1, "TCPMbps": 213.8, "LoadAvg": "0.1 0.7"}],
    "link": {"mode": "local", "results": [
        {"case": "wg-direct", "path": "wireguard", "mbit_s": 2770.1, "relay_cpu_s": None, "error": None},
        {"case": "link-derp", "path": "derp", "error": "no path"}]},
    "sdk": {"summary": [], "runs": [{"path": "direct", "repeat": 1, "goodput_mbit_s": 1380.4},
                                    {"path": "direct", "repeat": 2, "goodput_mbit_s": 1390.4}]},
    "soak": {"config": {"relay": "udp"}, "summary": {"rss_start": 10, "loss": 0.0, "drops_at_end": {"x": 1},
                                                     "latency_p50_first_last_us": [1, 2]}},
}


def read(path):
    return json.loads(Path(path).read_text())


class RunDirectory(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="ferry-layout-test-"))
        self.addCleanup(shutil.rmtree, self.root)

    def test_is_named_date_suite_tag_with_raw(self):
        d = layout.run_dir("pps", "batch-ab", date="2026-11-26", root=self.root)
        self.assertEqual(d, self.root / "2026-11-26-pps-batch-ab")
        self.assertTrue((d / "raw").is_dir())
        self.assertEqual(layout.parse_name(d.name), ("2026-11-26", "pps", "batch-ab"))

    def test_refuses_an_unknown_suite_or_a_bad_tag(self):
        with self.assertRaises(ValueError):
            layout.run_dir("bogus", "x", root=self.root)
        for tag in ("", "-x", "a/b", "a b"):
            with self.assertRaises(ValueError, msg=tag):
                layout.run_dir("udp", tag, root=self.root)

    def test_new_prints_the_directory_it_made(self):
        p = subprocess.run([sys.executable, "-m", "ferrybench.layout", "new", "udp", "t1", "--root", str(self.root)],
                           capture_output=True, text=True, cwd=BENCH, check=True)
        d = Path(p.stdout.strip())
        self.assertEqual(d.parent, self.root)
        self.assertTrue(d.name.endswith("-udp-t1"), d.name)
        self.assertTrue((d / "raw").is_dir())


class Finish(unittest.TestCase):
    """Each shell suite and the soak: raw/ in, summary.json and results.md out."""

    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="ferry-layout-test-"))
        self.addCleanup(shutil.rmtree, self.root)

    def finish(self, suite):
        d = layout.run_dir(suite, "test", date="2026-11-28", root=self.root)
        (d / "raw" / f"{suite}.json").write_text(json.dumps(RAW[suite]))
        p = subprocess.run([sys.executable, "-m", "ferrybench.layout", "finish", str(d), "--pinning", "relay on CPU 0"],
                           capture_output=True, text=True, cwd=BENCH)
        self.assertEqual(p.returncode, 0, p.stderr)
        return d

    def test_every_shell_suite_and_the_soak_get_the_three_parts(self):
        for suite in ("udp", "pps", "tunnel", "link", "sdk", "soak"):
            with self.subTest(suite=suite):
                d = self.finish(suite)
                self.assertTrue((d / "results.md").stat().st_size > 0)
                self.assertEqual([p.name for p in (d / "raw").iterdir()], [f"{suite}.json"])
                s = read(d / "summary.json")
                for k in ("suite", "date", "tag", "commit", "machine", "pinning", "series"):
                    self.assertIn(k, s)
                self.assertEqual((s["suite"], s["date"], s["tag"], s["pinning"]),
                                 (suite, "2026-11-28", "test", "relay on CPU 0"))
                self.assertEqual(s["machine"]["cpus"], layout.host()["cpus"])
                self.assertTrue(s["series"])

    def test_a_series_is_the_median_and_spread_of_its_repeats(self):
        s = read(self.finish("udp") / "summary.json")
        ferry = next(x for x in s["series"] if x["series"] == {"relay": "ferry"})
        self.assertEqual(ferry["runs"], 2)
        self.assertEqual(ferry["metrics"]["tcp_mbits"], {"median": 1750.0, "min": 1700.0, "max": 1800.0, "n": 2})
        self.assertNotIn("repeat", ferry["metrics"])
        md = (self.root / "2026-11-28-udp-test" / "results.md").read_text()
        self.assertIn("| tcp_mbits | 1,750 | 1,700–1,800 | 2 |", md)

    def test_failed_runs_are_counted_not_averaged(self):
        s = read(self.finish("link") / "summary.json")
        derp = next(x for x in s["series"] if x["series"]["case"] == "link-derp")
        self.assertEqual((derp["runs"], derp["failed"], derp["metrics"]), (1, 1, {}))

    def test_finish_without_raw_results_fails(self):
        d = layout.run_dir("udp", "empty", root=self.root)
        p = subprocess.run([sys.executable, "-m", "ferrybench.layout", "finish", str(d)],
                           capture_output=True, text=True, cwd=BENCH)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no JSON results", p.stderr)


class ShellHelpers(unittest.TestCase):
    """bench/lib/results.sh, as the shell suites call it."""

    def test_dir_then_finish_from_bash(self):
        root = Path(tempfile.mkdtemp(prefix="ferry-layout-test-"))
        self.addCleanup(shutil.rmtree, root)
        script = """
            set -euo pipefail
            root=$1
            . "$root/bench/lib/results.sh"
            dir=$(bench_results_dir pps "$2")
            printf '%s' "$3" >"$dir/raw/pps.json"
            bench_results_finish "$dir" "relay on CPU 0"
            echo "$dir"
        """
        p = subprocess.run(["bash", "-c", script, "bash", str(BENCH.parent), "shell", json.dumps(RAW["pps"])],
                           capture_output=True, text=True, env=os.environ | {"FERRY_BENCH_RESULTS": str(root)})
        self.assertEqual(p.returncode, 0, p.stderr)
        d = Path(p.stdout.strip().splitlines()[-1])
        self.assertEqual(d.parent, root)
        self.assertTrue(d.name.endswith("-pps-shell"), d.name)
        self.assertTrue((d / "results.md").is_file())
        self.assertEqual(read(d / "summary.json")["pinning"], "relay on CPU 0")


class DerpSuite(unittest.TestCase):
    """The DERP suite's outputs, rebuilt (--rerender) from stored raw reports."""

    def test_rerender_writes_the_layout(self):
        root = Path(tempfile.mkdtemp(prefix="ferry-layout-test-"))
        self.addCleanup(shutil.rmtree, root)
        d = root / "2026-11-28-derp-rerender"
        shutil.copytree(BENCH / "results" / "2026-11-26-derp-mesh" / "raw", d / "raw")
        p = subprocess.run([sys.executable, "-c", "import sys; from ferrybench.outputs import rerender; "
                            "from ferrybench.cli import parse_args; from ferrybench.plans import plan_for; "
                            "sys.argv = ['run', 'full', '--rerender', '--out', sys.argv[1]]; "
                            "_, a = parse_args(); rerender(a, plan_for(a))", str(d)],
                           capture_output=True, text=True, cwd=BENCH)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue((d / "results.md").stat().st_size > 0)
        s = read(d / "summary.json")
        self.assertEqual((s["suite"], s["tag"]), ("derp", "rerender"))
        for k in ("date", "commit", "machine", "pinning"):
            self.assertIn(k, s)
        self.assertIn("CPU", s["pinning"])
        mesh = s["summary"]["mesh"]
        self.assertTrue(mesh, "no mesh series")


class StoredResults(unittest.TestCase):
    """bench/results/ holds run directories of the layout only."""

    def test_every_directory_is_named_by_the_layout_and_has_summary_and_tables(self):
        dirs = [p for p in (BENCH / "results").iterdir() if p.is_dir()]
        self.assertGreater(len(dirs), 30)
        for d in dirs:
            with self.subTest(d=d.name):
                named = layout.parse_name(d.name)
                self.assertIsNotNone(named, "not <date>-<suite>-<tag>")
                self.assertTrue((d / "summary.json").is_file())
                self.assertTrue((d / "results.md").is_file())
                s = read(d / "summary.json")
                for k in ("suite", "date", "tag", "commit", "machine", "pinning"):
                    self.assertIn(k, s)
                self.assertEqual((s["date"], s["suite"], s["tag"]), named)

    def test_no_suite_keeps_results_of_its_own(self):
        for suite in ("udp", "link", "tunnel", "sdk"):
            self.assertFalse((BENCH / suite / "results").exists(), suite)


if __name__ == "__main__":
    unittest.main()
