"""LocalCluster helpers for the tests: the repository root, and one real 2-rank local cluster
per module (the integration modules share it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bubblespec.cluster import LocalCluster
from tests.deploy.helpers import engine_model_dir

REPO_ROOT = Path(__file__).resolve().parents[2]


def local_cluster(tmp_path_factory: pytest.TempPathFactory, **kw: Any
                  ) -> Iterator[LocalCluster]:
    """Start a 2-rank LocalCluster on the test model (skip without one); yield it; stop it."""
    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama or set BUBBLESPEC_TEST_MODEL")
    kw.setdefault("start_timeout_s", 300)
    with LocalCluster(ranks=2, model=model, log_dir=tmp_path_factory.mktemp("cluster-logs"),
                      **kw) as c:
        yield c
