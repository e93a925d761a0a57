"""Smoke test of the suffix benchmark: it runs, and its last line has the agreed format."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from bubblespec.bench.suffix import accepted_prefix, make_workload

ROOT = Path(__file__).resolve().parents[2]
NUM = r"(\d+\.\d{3}|n/a)"
LAST = re.compile(rf"^ratios vs arctic: speculate_median={NUM} insert_per_token={NUM} "
                  rf"bytes_per_token={NUM} accepted_per_step={NUM}$")


def run_bench(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "bench", "suffix",
                          "--groups", "1", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_bench_last_line_without_arctic():
    lines = run_bench("--no-arctic")
    assert lines[-2] == "arctic-inference skipped (--no-arctic)"
    assert lines[-1] == ("ratios vs arctic: speculate_median=n/a insert_per_token=n/a "
                         "bytes_per_token=n/a accepted_per_step=n/a")
    assert any(line.startswith("bubblespec Matcher.speculate") for line in lines)


def test_bench_last_line_format():
    lines = run_bench("--no-live")
    assert LAST.match(lines[-1]), lines[-1]


def test_workload_is_seeded_and_rl_like():
    a, b = make_workload(2, seed=3), make_workload(2, seed=3)
    assert all(np.array_equal(x, y) for ga, gb in zip(a, b) for x, y in zip(ga, gb))
    for group in a:
        assert len(group) == 8 and all(r.dtype == np.int32 for r in group)
        assert all(900 <= len(r) <= 4_200 for r in group)
        # siblings share most 8-grams with each other (edits every ~50 tokens)
        grams = [{tuple(r[i:i + 8]) for i in range(len(r) - 8)} for r in group]
        assert len(grams[0] & grams[1]) > 0.5 * len(grams[0])
    assert accepted_prefix([1, 2, 3], [0, 1, 2, 4], 1) == 2
