"""One real cluster (synchronizer, two ranks with engines, gateway; bearer token on) shared
by the hostile-input suite's HTTP tests and fault drills (package scope)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bubblespec.client import BubbleSpecClient
from bubblespec.cluster import LocalCluster
from tests.cluster.helpers import local_cluster

TOKEN = "hostile-suite-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory, token=TOKEN, start_timeout_s=600)


@pytest.fixture(scope="package")
def client(cluster: LocalCluster) -> Iterator[BubbleSpecClient]:
    with BubbleSpecClient(cluster.gateway_url, token=TOKEN, timeout_s=300) as c:
        yield c


@pytest.fixture(scope="package")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


@pytest.fixture()
def http() -> Iterator[httpx.Client]:
    """One keep-alive connection pool per test (a dropped connection shows in the test)."""
    with httpx.Client(timeout=120) as c:
        yield c
