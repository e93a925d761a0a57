"""The real model's directory for tests/models (built by `make real-model`, which `make test`
runs first); its engine fixtures come from tests/engine_fixtures.py, on the real model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine_fixtures import LoopRunner, loop_runner

__all__ = ["loop_runner", "real_dir", "real_plain", "real_spec"]


@pytest.fixture(scope="package")
def real_dir() -> Path:
    from bubblespec.models import real_model_dir

    return real_model_dir()


def _start(runner: LoopRunner, model: Path, **kw: Any) -> Any:
    from bubblespec.engine import EngineConfig
    from bubblespec.engine.engine import RolloutEngine

    return runner.run(RolloutEngine.start(EngineConfig(model=str(model), max_model_len=2048,
                                                       **kw)))


@pytest.fixture(scope="package")
def real_plain(loop_runner: LoopRunner, real_dir: Path) -> Iterator[Any]:
    eng = _start(loop_runner, real_dir, spec_mode="none")
    yield eng
    loop_runner.run(eng.shutdown())


@pytest.fixture(scope="package")
def real_spec(loop_runner: LoopRunner, real_dir: Path) -> Iterator[Any]:
    eng = _start(loop_runner, real_dir, spec_mode="bubblespec", num_speculative_tokens=8)
    yield eng
    loop_runner.run(eng.shutdown())
