"""One default 2-rank cluster shared by the client-API modules (OpenAI, scoring, SGLang): their
tests compare samples and scores and push the same weights under relative versions, so none
depends on a fresh cluster, and `make test` starts one cluster for the three instead of
three (each start is half a minute of engine warm-up). Package scope in a package of their
own: the cluster stops when these modules are done, not at the end of tests/integration, so
it does not idle beside the other modules' clusters on CI's 2 cores."""

from __future__ import annotations

from collections.abc import Iterator

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
