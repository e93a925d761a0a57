"""One default 2-rank cluster shared by the client-API modules (OpenAI, scoring, SGLang): their
tests compare samples and scores and push the same weights under relative versions, so none
depends on a fresh cluster, and `make test` starts one cluster for the three instead of
three (each start is half a minute of engine warm-up)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bubblespec.cluster import LocalCluster
from tests.cluster.helpers import local_cluster

#: How long the gateway waits for another per-sample call before it cuts a step (the
#: SGLang and OpenAI routes). The default 0.05 s suits a gateway with a core of its own; on
#: CI's 2 cores, shared with two busy engines, a slime-style burst of concurrent calls
#: arrived with a longer gap once and split into two steps, so the tests that check a burst
#: is one step give it 0.5 s (still cut at most `--sglang-max-wait-s` 1 s after its first).
QUIET_S = "0.5"


@pytest.fixture(scope="package")
def api_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory, gateway_args=("--sglang-quiet-s", QUIET_S))


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
