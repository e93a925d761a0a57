"""Real vLLM engines for the test packages that need one (tests/engine, tests/rank).

Each package's conftest imports the fixtures it uses from here, so each package gets its own
engines (each takes ~15 s to start); package scope: they stop before later packages run,
so they do not compete for the CPU or memory.

AsyncLLM lives on one event loop, so the engines run on a background loop thread and
tests submit coroutines to it with `loop_runner.run(coro)`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


class LoopRunner:
    """An asyncio loop on a daemon thread; `run` blocks until the coroutine is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine, timeout: float = 600) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="package")
def loop_runner() -> Iterator[LoopRunner]:
    r = LoopRunner()
    yield r
    r.close()


def model_dir() -> str:
    """The model the engine tests run: $BUBBLESPEC_TEST_MODEL, else the embedded one."""
    from bubblespec.tasks import default_model_dir

    return os.environ.get("BUBBLESPEC_TEST_MODEL") or str(default_model_dir())


def model_task() -> Any:
    """The task of the test model: addchain on the embedded model; on any other
    ($BUBBLESPEC_TEST_MODEL, e.g. the real model) wordproblems, its chat prompts encoded by
    that model's own tokenizer."""
    from pathlib import Path

    from bubblespec.tasks import default_model_dir, default_task, make_task

    model = Path(model_dir()).resolve()
    if model == default_model_dir().resolve():
        return default_task()
    return make_task("wordproblems", model)


def start_engine(runner: LoopRunner, **kw: Any) -> Any:
    """A `RolloutEngine` on the test model, started on `runner`'s loop."""
    from bubblespec.engine import EngineConfig
    from bubblespec.engine.engine import RolloutEngine

    cfg = EngineConfig(model=model_dir(), **kw)
    return runner.run(RolloutEngine.start(cfg))


@pytest.fixture(scope="package")
def plain_engine(loop_runner: LoopRunner) -> Iterator[Any]:
    eng = start_engine(loop_runner, spec_mode="none")
    yield eng
    loop_runner.run(eng.shutdown())


@pytest.fixture(scope="package")
def spec_engine(loop_runner: LoopRunner) -> Iterator[Any]:
    # every draft source on but history (the default sources), so the exactness tests
    # cover them all
    eng = start_engine(loop_runner, spec_mode="bubblespec", num_speculative_tokens=8)
    yield eng
    loop_runner.run(eng.shutdown())


@pytest.fixture(scope="package")
def biased_engine(loop_runner: LoopRunner) -> Iterator[Any]:
    """A speculative engine whose verifier accepts drafts with probability 8p (fault injected
    on purpose): the exactness tests' negative control, shared by them. Its drafts are not
    capped by the draft budget (`draft_budget="off"`): the budget would cut the adversarial
    drafts it learns are rejected, and with them the control's power."""
    eng = start_engine(loop_runner, spec_mode="bubblespec", num_speculative_tokens=8,
                       fault_biased_verifier=8.0, draft_budget="off")
    yield eng
    loop_runner.run(eng.shutdown())
