"""`bubblespec predict` on the command line: one command from a trace to labelled speed-ups
with intervals, predict.json and the plot; the bench's own trace by --export; a published
length distribution by its statistics; bad input exits 2 with one line naming the line and
the field (no traceback). Every figure is MODELLED."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bubblespec.calibration.predict import DEFAULT_CALIBRATION
from bubblespec.cli.main import main as bubblespec
from bubblespec.cli.predict import main

DATA = Path(__file__).parents[1] / "calibration" / "data"
PACED = DEFAULT_CALIBRATION
REASONING = DATA / "reasoning_stats.jsonl"
"""Per-step statistics of a published long-tailed length distribution: log-normal, median
500 and p99 5,000 tokens ("a typical reasoning-RL run's per-rollout length distribution",
https://jiahuanglin.xyz/all_lessons/RL/lessons/22b_longtail_rollouts.html); mean 816 =
500 exp(sigma^2 / 2), sigma = ln 10 / 2.326. Four identical steps."""


def test_bench_trace_in_one_command(tmp_path, capsys):
    trace = tmp_path / "paced.jsonl"
    assert bubblespec(["predict", "--export", f"{PACED}:all", str(trace)]) == 0
    assert len(trace.read_text().splitlines()) == 3
    assert "wrote" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main([str(trace), "--ranks", "8", "--seeds", "4", "--calibration", str(PACED),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[-1].startswith("predicted_speedup_vs_nospec (MODELLED): bubblespec=")
    assert all(x.startswith("[modelled]") for x in text[:-1])
    doc = json.loads((out / "predict.json").read_text())
    assert doc["label"].startswith("MODELLED") and doc["ranks"] == 8
    assert set(doc["modes"]) == {"bubblespec", "bubblespec-keyed", "bubblespec-keyed-window",
                                 "suffix"}
    assert (out / "predict.png").stat().st_size > 0


def test_published_distribution_gives_a_speedup_with_an_interval(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(REASONING), "--ranks", "8", "--prompts", "16", "--n", "8", "--seeds",
                 "3", "--calibration", str(PACED), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "log-normal fitted to mean and median" in text and "ASSUMED shape" in text
    doc = json.loads((out / "predict.json").read_text())
    assert doc["trace_kind"] == "generic"
    for name, m in doc["modes"].items():
        assert m["low"] < m["speedup"] < m["high"], name
    assert doc["modes"]["bubblespec-keyed"]["speedup"] > 1.0


def test_accept_json_replaces_the_calibrated_acceptance(tmp_path, capsys):
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"nospec": {"accepted_per_forward": 0},
                               "suffix": {"accepted_per_forward": 0.5},
                               "bubblespec": {"accepted_per_forward": 1.2,
                                              "pregen_coverage": 0.8}}))
    assert main([str(REASONING), "--ranks", "4", "--prompts", "8", "--n", "4", "--seeds", "2",
                 "--calibration", str(PACED), "--accept-json", str(acc)]) == 0
    text = capsys.readouterr().out
    assert "acceptance from --accept-json" in text
    assert "bubblespec-keyed" not in text.splitlines()[-1]


@pytest.mark.parametrize("args,needle", [
    (["--ranks", "8"], "line 2: lengths: expected a non-empty list"),
    (["--ranks", "0"], "--ranks and --seeds must be >= 1"),
    ([], "--ranks is required"),
    (["--ranks", "8", "--calibration", "missing.json"], "--calibration missing.json: no such"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, needle):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"step": 0, "lengths": [3, 4], "prompt_ids": [1, 1]}\n'
                     '{"step": 1, "lengths": []}\n' if "8" in args and len(args) == 2 else
                     '{"step": 0, "lengths": [3, 4], "prompt_ids": [1, 1]}\n'
                     '{"step": 1, "lengths": [5, 6], "prompt_ids": [1, 1]}\n')
    assert main([str(trace), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bubblespec predict: error:"), err
    assert needle in err[0] and "Traceback" not in err[0]


def test_statistics_without_a_batch_size(capsys):
    assert main([str(REASONING), "--ranks", "8", "--calibration", str(PACED)]) == 2
    assert "give --n" in capsys.readouterr().err
    assert main([str(REASONING), "--ranks", "8", "--n", "8", "--calibration",
                 str(PACED)]) == 2
    assert "give --prompts" in capsys.readouterr().err


def test_export_of_a_missing_mode(tmp_path, capsys):
    assert main([str(tmp_path / "t.jsonl"), "--export", f"{PACED}:nope"]) == 2
    err = capsys.readouterr().err
    assert "no mode 'nope'" in err and "Traceback" not in err
    assert main([str(tmp_path / "t.jsonl"), "--export", "nocolon"]) == 2
    assert "want PACED_JSON:MODE" in capsys.readouterr().err
