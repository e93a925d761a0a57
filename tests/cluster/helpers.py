"""Cluster helpers for the tests: the repository root, one real 2-rank local cluster per
module (the integration modules share it), and the processes of a role's process group."""

from __future__ import annotations

import contextlib
import os
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


def process_group(pgid: int) -> list[int]:
    """The processes of a role's process group but its leader (the reaper): the server and
    its engine processes."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(int(entry)) == pgid:
                    out.append(int(entry))
    return out
