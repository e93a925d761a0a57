"""One default 2-rank cluster shared by the client-API modules (OpenAI, scoring, SGLang): their
tests compare samples and scores and push the same weights under relative versions, so none
depends on a fresh cluster, and `make test` starts one cluster for the three instead of
three (each start is half a minute of engine warm-up)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bubblespec.cluster import LocalCluster
from tests.cluster.helpers import local_cluster


@pytest.fixture(scope="package")
def api_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory)
