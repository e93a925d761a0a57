"""Smoke test of the batch drafting benchmark: it runs, the native step (and the engine
proposer on it, when vLLM is installed) drafts what the pure-Python step drafts, and the
last line has the agreed format."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAST = re.compile(r"^draft_cost_per_step_us: b8=\d+\.\d b16=\d+\.\d arctic_b256=n/a$")


def test_bench_draft_batch_smoke():
    out = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "bench", "draft-batch",
                          "--sizes", "8,16", "--steps", "4", "--suffix-groups", "1",
                          "--no-arctic", "--no-ngram"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert LAST.match(lines[-1]), lines[-1]
    if any(line.startswith("bubblespec_native is not installed") for line in lines):
        return
    assert "DRAFTS DIFFER" not in out.stdout
    proposer = any("proposer (native)" in line for line in lines)
    assert sum("drafts = python" in line for line in lines) == (4 if proposer else 2)
    if proposer:  # the global_live source's row, at both sizes
        assert sum("proposer, global pool + live" in line for line in lines) == 2
    # the deferred step and, timed on its own, the appends it leaves for the forward's time
    rows = 2 * (3 if proposer else 1)  # native step (and 2 proposer) rows at both sizes
    deferred = [line for line in lines if line.rstrip().endswith("appends deferred")
                or "appends deferred  " in line]
    appends = [line for line in lines if "appends deferred: its appends" in line]
    assert len(deferred) == rows and len(appends) == rows, lines
    assert all(float(line.split()[-1]) > 0 for line in deferred)
    assert all(line.split()[-1] == "-" for line in appends)
    # the modelled forward beside the drafting cost, at both sizes
    assert sum(line.strip().startswith(("B=8:", "B=16:")) for line in lines) == 2, lines


def test_modelled_forward_lines_put_drafting_beside_the_engine_time_model() -> None:
    from bubblespec.bench.draft_batch import forward_lines
    from bubblespec.core.engine_time import EngineTime

    lines = forward_lines((64, 256), {64: 447.0, 256: None})
    one = EngineTime.preset("h100").forward(64, 64 * 2048) * 1e3
    assert f"h100 {one:.2f} / " in lines[1]
    share = 100 * 447.0 / (one * 1e3 + 447.0)
    assert f"drafting {share:.1f}% of the step" in lines[1]
    assert "drafting" not in lines[2]  # no measurement at 256
