"""`bubblespec simulate` end to end: output files, labels, errors (modelled)."""

from __future__ import annotations

import importlib.util
import json

from bubblespec.cli import simulate
from bubblespec.cli.main import COMMANDS


def test_registered():
    assert COMMANDS["simulate"][0] == "bubblespec.cli.simulate"


def test_run_writes_json_and_plot_and_labels_every_line(tmp_path, capsys):
    rc = simulate.main(["--ranks", "8,16", "--prompts-per-rank", "2", "--n", "4", "--steps",
                        "2", "--median-len", "200", "--max-new-tokens", "2000",
                        "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out and all("modelled" in line for line in out)
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert "modelled" in data["label"]
    assert {r["ranks"] for r in data["results"]} == {8, 16}
    assert {r["mode"] for r in data["results"]} == {"none", "ngram", "suffix", "bubblespec"}
    assert len(data["per_step"]) == 2 * 4 * 2
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "simulate.png").stat().st_size > 1000


def test_bad_input_returns_2(tmp_path, capsys):
    assert simulate.main(["--ranks", "0"]) == 2
    assert simulate.main(["--lengths", str(tmp_path / "missing.json")]) == 2
    assert simulate.main(["--mode", "bad"]) == 2
    assert all("modelled" in x for x in capsys.readouterr().err.strip().splitlines())
