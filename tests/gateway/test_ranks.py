"""Which rank states the gateway sends work to: a rank whose engine died is not ready."""

from __future__ import annotations

import pytest

from bubblespec.gateway.ranks import RankEndpoint


@pytest.mark.parametrize(("state", "error", "ready"), [
    ("idle", "", True), ("decoding", "", True), ("pregen", "", True),
    ("updating_weights", "", True), ("", "", False), ("starting", "", False),
    ("engine_dead", "", False), ("idle", "GET /v1/state: HTTP 500", False),
])
def test_ready_states(state: str, error: str, ready: bool) -> None:
    ep = RankEndpoint("r0", "http://127.0.0.1:1", "static", state=state, error=error)
    assert ep.ready is ready
    assert ep.as_dict()["ready"] is ready and ep.as_dict()["state"] == state
