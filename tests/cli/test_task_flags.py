"""`--task` on `run`, `train-demo` and `bench soak|engine|service|paced`: addchain on the
embedded model stays the default; wordproblems picks the real model, and when that is not
built every command stops with an error naming `make real-model` (before starting any engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bubblespec.bench.run import RunConfig
from bubblespec.cli import bench, run, train_demo
from bubblespec.tasks import default_model_dir, task_model_dir
from bubblespec.train.demo import resolve_model


@pytest.fixture
def no_real_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache: the real model is 'not built'."""
    monkeypatch.setenv("BUBBLESPEC_CACHE", str(tmp_path))
    return tmp_path


def test_default_task_is_addchain_on_the_embedded_model() -> None:
    cfg = RunConfig(**vars(run.parse_args([])))
    assert cfg.task == "addchain" and cfg.model_dir() == str(default_model_dir())
    assert train_demo.parse_args([]).task == "addchain"
    assert bench.build_parser().parse_args(["soak"]).task == "addchain"
    assert resolve_model(None) == str(default_model_dir())
    assert resolve_model("/some/dir", "wordproblems") == "/some/dir"


def test_wordproblems_resolves_to_the_real_model(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from bubblespec.models.smollm2 import MODEL_NAME, model_dir

    monkeypatch.setenv("BUBBLESPEC_CACHE", str(tmp_path))
    assert model_dir(check=False) == tmp_path / MODEL_NAME
    cfg = RunConfig(**vars(run.parse_args(["--task", "wordproblems", "--model", "/m"])))
    assert cfg.task == "wordproblems" and cfg.model_dir() == "/m"
    with pytest.raises(ValueError, match="unknown task"):
        task_model_dir("nope")


def test_missing_real_model_is_an_error_not_a_crash(no_real_model: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--task", "wordproblems"]) == 1
    assert train_demo.main(["--task", "wordproblems"]) == 1
    assert bench.main(["soak", "--task", "wordproblems", "--out",
                       str(no_real_model / "soak")]) == 2
    assert bench.main(["engine", "--task", "wordproblems"]) == 2
    assert bench.main(["service", "--task", "wordproblems"]) == 2
    assert bench.main(["paced", "--task", "wordproblems"]) == 2
    err = capsys.readouterr().err
    assert err.count("make real-model") == 6, err


def test_unknown_task_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for parse in (run.parse_args, train_demo.parse_args):
        with pytest.raises(SystemExit):
            parse(["--task", "nope"])
    assert "invalid choice" in capsys.readouterr().err
