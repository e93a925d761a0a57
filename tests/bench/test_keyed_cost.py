"""`bench keyed-cost` at a tiny size (it runs, its JSON has its structure, every arm ran the
same requests and keyed outputs did not depend on speculation: no timed assertion), and
`keyed_noise_gpu.py`'s keyed noise (the engine's own) against the numpy reference, and
the script's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bubblespec.bench import keyed_cost as kc
from bubblespec.bench import keyed_noise_gpu as kg

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two engines started in a subprocess (~75 s): `make test-slow`
def test_bench_keyed_cost_tiny(tmp_path):
    out_json = tmp_path / "kc.json"
    out = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "bench", "keyed-cost",
                          "--sizes", "8", "--n", "4", "--max-new-tokens", "6", "--repeats", "1",
                          "--out", str(out_json)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out_json.read_text())
    runs = doc["runs"]
    # 2 spec modes x 1 size x 3 arms x 1 repeat (the warm-up is not recorded)
    assert sorted((r["spec"], r["arm"]) for r in runs) == sorted(
        (s, a) for s in ("none", "bubblespec") for a in kc.ARMS)
    assert len({r["workload"] for r in runs}) == 1  # the same prompts, n and lengths
    assert {r["tokens"] for r in runs} == {8 * 6} and {r["requests"] for r in runs} == {8}
    assert all(r["engine_steps"] >= 1 and r["wall_s"] > 0 for r in runs)
    rows = doc["summary"]["rows"]
    assert [(r["spec"], r["size"]) for r in rows] == [("none", 8), ("bubblespec", 8)]
    for row in rows:
        assert row["same_workload"] and row["same_tokens"] and row["keyed_reproducible"]
        assert set(row["keyed_extra_share_of_modelled_step"]) == {
            str(c) for c in kc.MODEL_CONTEXTS}
        for arm in kc.ARMS:
            assert row[arm]["ms_per_step"]["n"] == 1
    assert doc["summary"]["keyed_same_across_spec_modes"]
    assert "keyed outputs identical across spec modes: True" in out.stdout


def test_cli_rejects_bad_sizes():
    from bubblespec.cli.bench import main

    assert main(["keyed-cost", "--sizes", "10", "--n", "8"]) == 2
    assert main(["keyed-cost", "--spec-modes", "eagle"]) == 2


def test_the_bench_times_the_engines_keyed_noise():
    from bubblespec.engine import keyed_kernels as keyed

    keys = torch.tensor([3, -5, 2**62 + 1, -(2**63)], dtype=torch.long)
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0))
    assert kg.uniforms_of_keys is keyed.uniforms_of_keys  # one torch home of SplitMix64
    assert torch.equal(kg.keyed_argmax(logits, keys), keyed.keyed_argmax(logits, keys, "eager"))
    assert kg.check_reference(vocab=512) is True


def test_the_script_structure(tmp_path):
    out = tmp_path / "noise.json"
    assert kg.main(["--device", "cpu", "--rows", "2", "--vocab", "64", "--warmup", "1",
                    "--repeats", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (shape,) = doc["shapes"]
    assert (shape["rows"], shape["vocab"]) == (2, 64)
    for arm in ("vllm_unseeded", "vllm_seeded", "keyed_noise", "keyed_extra",
                "keyed_verify_rows"):
        assert shape[arm]["n"] == 3 and shape[arm]["median_ms"] > 0
    counts = kg.count_bytes(vocab=1024, rows=2)
    assert counts["keyed_noise_kernels"] > counts["vllm_unseeded_kernels"] > 0
