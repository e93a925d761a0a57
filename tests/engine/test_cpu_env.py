"""vLLM's CPU environment as the engine sets it before start (`vllm_glue.set_cpu_env`): the
KV-cache size in GiB or exact MiB, and unbound OpenMP threads for ranks that share cores."""

from __future__ import annotations

import os

import pytest

from bubblespec.engine import vllm_glue
from bubblespec.engine.config import EngineConfig

KEYS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in KEYS:
        monkeypatch.delenv(k, raising=False)


def test_default_keeps_vllm_thread_binding() -> None:
    vllm_glue.set_cpu_env(kv_cache_gib=2, kv_cache_mib=0, cpu_threads=0)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    assert "OMP_NUM_THREADS" not in os.environ


def test_exact_mib_removes_the_gib_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    vllm_glue.set_cpu_env(kv_cache_gib=1, kv_cache_mib=256, cpu_threads=0)
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ


def test_cpu_threads_unbind_and_count() -> None:
    vllm_glue.set_cpu_env(kv_cache_gib=1, kv_cache_mib=0, cpu_threads=1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_cpu_threads_is_a_checked_setting() -> None:
    assert EngineConfig().cpu_threads == 0
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineConfig(cpu_threads=-1)
