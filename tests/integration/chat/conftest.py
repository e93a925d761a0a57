"""The real chat model's 2-rank cluster, shared by the chat and agentic-framework modules.
Package scope in a package of their own: the cluster (two engines on the real model) stops
when these modules are done, not at the end of tests/integration, so it does not idle beside
the other modules' clusters on CI's 2 cores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bubblespec.cluster import LocalCluster


@pytest.fixture(scope="package")
def real_dir() -> Path:
    """The real chat model (SmolLM2-135M-Instruct: its tokenizer carries a chat template; the
    embedded tiny model has none); the modules that need it are skipped without it."""
    from bubblespec.models import real_model_dir

    try:
        return real_model_dir()
    except FileNotFoundError as e:
        pytest.skip(f"chat needs a model with a chat template: {e}")


@pytest.fixture(scope="package")
def chat_cluster(real_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[LocalCluster]:
    """A 2-rank cluster on the real chat model, shared by the chat and agentic-framework
    modules; its gateway parses tool calls with vLLM's hermes parser, as a vLLM server
    started with `--enable-auto-tool-choice --tool-call-parser hermes` does."""
    with LocalCluster(ranks=2, model=str(real_dir), start_timeout_s=300,
                      gateway_args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
                      log_dir=tmp_path_factory.mktemp("chat-cluster-logs")) as c:
        yield c


@pytest.fixture(scope="package")
def chat_client(chat_cluster: LocalCluster) -> Iterator[object]:
    """The real `openai` client on the chat cluster's gateway."""
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=chat_cluster.gateway_url + "/v1", api_key="unused",
                       timeout=300, max_retries=0) as c:
        yield c
