"""Every route's validation (4xx naming the field), auth, limits, health and metrics.

The gateway runs in-process (TestClient); the synchronizer is a real `bubblespec sync`
process. No rank servers here: a valid rollout ends in 503 "no rank is ready".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bubblespec.protocol.domain import Span, SpanKind
from bubblespec.synchronizer.client import SyncClient

from .helpers import dead_address, gateway, sync_daemon

TOKEN = "s3cret"
OK = {"prompts": [{"input_ids": [1, 5, 6]}], "n": 2}


@pytest.fixture(scope="module")
def sync_addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sync_daemon(tmp_path_factory.mktemp("sync")) as addr:
        yield addr


@pytest.fixture(scope="module")
def gw(sync_addr: str) -> Iterator[TestClient]:
    with gateway(sync_address=sync_addr, max_prompts=4, max_prompt_tokens=64,
                 max_new_tokens=1000, max_body_bytes=64 * 1024, max_n=64) as c:
        yield c


def with_(**kw: Any) -> dict[str, Any]:
    return {**OK, **kw}


BAD_ROLLOUTS = [
    ({}, "prompts"),
    ({"prompts": []}, "prompts"),
    (with_(prompts=[{"input_ids": [1, -2]}]), "prompts[0].input_ids[1]"),
    (with_(prompts=[{"input_ids": [1, 2]}, {"input_ids": [1, 99999]}]),
     "prompts[1].input_ids[1]"),
    (with_(prompts=[{"input_ids": [1], "text": "1 + 2 x 3 ="}]), "prompts[0]"),
    (with_(prompts=[{}]), "prompts[0]"),
    (with_(prompts=[{"input_ids": []}]), "prompts[0]"),
    (with_(prompts=[{"text": "  "}]), "prompts[0]"),
    (with_(prompts=[{"input_ids": "abc"}]), "prompts[0].input_ids"),
    (with_(prompts=[{"input_ids": [1, 2.5]}]), "prompts[0].input_ids[1]"),
    (with_(prompts=[{"input_ids": [1]}] * 5), "prompts"),
    (with_(prompts=[{"input_ids": [1] * 65}]), "prompts[0].input_ids"),
    (with_(prompts=[{"input_ids": [1]}, {"txt": "x"}]), "prompts[1].txt"),
    (with_(n=0), "n"),
    (with_(n=65), "n"),
    (with_(n="many"), "n"),
    (with_(step=-1), "step"),
    (with_(bogus=1), "bogus"),
    (with_(sampling_params={"temperature": -1}), "sampling_params.temperature"),
    (with_(sampling_params={"temperature": "hot"}), "sampling_params.temperature"),
    (with_(sampling_params={"top_p": 0}), "sampling_params.top_p"),
    (with_(sampling_params={"top_p": 1.5}), "sampling_params.top_p"),
    (with_(sampling_params={"top_k": -2}), "sampling_params.top_k"),
    (with_(sampling_params={"max_new_tokens": 0}), "sampling_params.max_new_tokens"),
    (with_(sampling_params={"max_new_tokens": 1001}), "sampling_params.max_new_tokens"),
    (with_(sampling_params={"stop_token_ids": [3, 100000]}),
     "sampling_params.stop_token_ids[1]"),
    (with_(sampling_params={"temp": 1.0}), "sampling_params.temp"),
    (with_(seeds=[[1, 2], [3, 4]]), "seeds"),
    (with_(seeds=[[1]]), "seeds[0]"),
    (with_(seeds=[[1, -2]]), "seeds[0][1]"),
    (with_(seeds=[[2**63, 1]]), "seeds[0][0]"),
    (with_(next_prompts=[{"input_ids": [1, 300]}]), "next_prompts[0].input_ids[1]"),
    (with_(next_prompts=[{"input_ids": [1]}] * 5), "next_prompts"),
    (with_(next_seeds=[[1, 2]]), "next_seeds"),
    (with_(next_prompts=[{"input_ids": [1]}], next_seeds=[[1, 2, 3]]), "next_seeds[0]"),
    # next_prompts as a list of the next steps' batches
    (with_(next_prompts=[[{"input_ids": [1]}], [{"input_ids": [1, 300]}]]),
     "next_prompts[1][0].input_ids[1]"),
    (with_(next_prompts=[[{"input_ids": [1]}], [{"input_ids": [1]}] * 5]), "next_prompts[1]"),
    (with_(next_prompts=[[{"input_ids": [1]}]] * 9), "next_prompts"),
    (with_(next_prompts=[[{"input_ids": [1]}]] * 2, next_seeds=[[[1, 2]]]), "next_seeds"),
    (with_(next_prompts=[[{"input_ids": [1]}]] * 2, next_seeds=[[[1, 2]], [[1]]]),
     "next_seeds[1][0]"),
    (with_(next_prompts=[[{"input_ids": [1]}], [{"ids": [1]}]]), "next_prompts[1][0].ids"),
    (with_(return_logprobs="perhaps"), "return_logprobs"),
]


@pytest.mark.parametrize(("body", "field"), BAD_ROLLOUTS)
def test_rollout_validation_names_the_field(gw: TestClient, body: dict, field: str) -> None:
    r = gw.post("/v1/rollout", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert field in r.json()["detail"] or r.json()["detail"]


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"null", b"\"x\"", b"", b"\xff\xfe"])
def test_malformed_bodies_are_422_on_body(gw: TestClient, raw: bytes) -> None:
    r = gw.post("/v1/rollout", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["field"] in ("body", ""), r.json()
    assert "detail" in r.json()


def test_oversized_bodies_are_413(gw: TestClient) -> None:
    big = with_(prompts=[{"input_ids": [1] * 50_000}])
    r = gw.post("/v1/rollout", json=big)
    assert r.status_code == 413 and r.json()["field"] == "body"

    def chunks() -> Iterator[bytes]:  # no content-length: counted while streaming
        yield b'{"prompts": [{"input_ids": ['
        for _ in range(40_000):
            yield b"1, "
        yield b"1]}]}"

    r = gw.post("/v1/rollout", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body"


def test_valid_rollout_without_ranks_is_503_naming_the_problem(gw: TestClient) -> None:
    r = gw.post("/v1/rollout", json=with_(prompts=[{"text": "12 + 7 x 3 ="}]))
    assert r.status_code == 503
    assert "no rank is ready" in r.json()["detail"]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "path"), ({"path": ""}, "path"), ({"path": "/x", "version": -1}, "version"),
    ({"path": "/x", "version": "new"}, "version"), ({"path": "/x", "extra": 1}, "extra"),
    ({"path": "/x", "version": 2**63}, "version"), ({"path": "/x", "force": "maybe"}, "force"),
])
def test_weights_validation(gw: TestClient, body: dict, field: str) -> None:
    r = gw.post("/v1/weights", json=body)
    assert r.status_code == 422 and r.json()["field"] == field, r.text


def test_weights_without_ranks_is_503(gw: TestClient) -> None:
    r = gw.post("/v1/weights", json={"path": "/nonexistent"})
    assert r.status_code == 503 and "no rank" in r.json()["detail"]


@pytest.mark.parametrize(("path", "status"), [("/v1/steps/-1", 422), ("/v1/steps/abc", 422),
                                              ("/v1/steps/99999", 404),
                                              (f"/v1/steps/{2**64}", 422)])
def test_steps_validation(gw: TestClient, path: str, status: int) -> None:
    r = gw.get(path)
    assert r.status_code == status, r.text
    assert r.json()["field"] == "step"


def test_unknown_route_and_method(gw: TestClient) -> None:
    r = gw.get("/v1/nothing")
    assert r.status_code == 404 and set(r.json()) == {"detail", "field"}
    r = gw.get("/v1/rollout")
    assert r.status_code == 405


def test_health_ranks_config_metrics(gw: TestClient, sync_addr: str) -> None:
    assert gw.get("/health").json() == {"status": "ok"}
    r = gw.get("/health_generate")
    assert r.status_code == 503 and "no rank ready" in r.json()["detail"]
    ranks = gw.get("/v1/ranks").json()
    assert ranks["sync_ok"] is True and isinstance(ranks["ranks"], list)
    cfg = gw.get("/config").json()
    assert cfg["sync_address"] == sync_addr and cfg["max_prompts"] == 4
    text = gw.get("/metrics").text
    assert 'bubblespec_gateway_requests_total{code="422",route="/v1/rollout"}' in text
    assert "bubblespec_gateway_rollout_duration_seconds_bucket" in text
    assert 'le="2500.0"' in text
    assert "bubblespec_build_info" in text and 'role="gateway"' in text


def test_step_timeline_from_the_real_synchronizer(gw: TestClient, sync_addr: str) -> None:
    async def make_step() -> None:
        async with SyncClient(sync_addr) as s:
            await s.register("tl0", "127.0.0.1:1")
            await s.register("tl1", "127.0.0.1:2")
            state = await s.get_state()
            step = (state.current_step or 0) + 1000
            await s.open_step(step, {"tl0": 2, "tl1": 2})
            import time
            now = time.time()
            await s.report_spans("tl0", step, [Span(SpanKind.DECODE, now - 1, now, 10)])
            await s.report_done(step, "tl0")
            await s.report_done(step, "tl1")
            return step

    step = asyncio.run(make_step())
    r = gw.get(f"/v1/steps/{step}")
    assert r.status_code == 200, r.text
    body = r.json()
    t = body["timeline"]
    assert t["step"] == step and t["complete"] is True
    assert [x["rank_id"] for x in t["ranks"]] == ["tl0", "tl1"]
    assert body["rollout"] is None  # not rolled out through this gateway
    # those ranks do not answer: listed, not ready
    ranks = {x["rank_id"]: x for x in gw.get("/v1/ranks").json()["ranks"]}
    assert ranks["tl0"]["ready"] is False and ranks["tl0"]["error"]


def test_auth_on_mutating_routes_only(sync_addr: str) -> None:
    with gateway(sync_address=sync_addr, token=TOKEN) as c:
        for route, body in (("/v1/rollout", OK), ("/v1/weights", {"path": "/x"})):
            r = c.post(route, json=body)
            assert r.status_code == 401 and r.json()["field"] == "authorization"
            r = c.post(route, json={"garbage": True}, headers={"authorization": "Bearer no"})
            assert r.status_code == 401  # auth before validation: nothing leaks
            r = c.post(route, json={"garbage": True},
                       headers={"authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 422
        assert c.get("/health").status_code == 200
        assert c.get("/v1/ranks").status_code == 200
        cfg = c.get("/config").json()
        assert TOKEN not in json.dumps(cfg) and cfg["token"] == "**********"


def test_unreachable_synchronizer(tmp_path: Path) -> None:
    with gateway(sync_address=dead_address(), sync_timeout_s=0.3) as c:
        r = c.get("/health_generate")
        assert r.status_code == 503 and "synchronizer unreachable" in r.json()["detail"]
        r = c.get("/v1/steps/0")
        assert r.status_code == 503 and r.json()["field"] == "step"
        assert c.get("/v1/ranks").json()["sync_ok"] is False
        r = c.post("/v1/rollout", json=OK)
        assert r.status_code == 503


def test_text_prompts_need_a_readable_tokenizer(tmp_path: Path) -> None:
    with gateway(tokenizer=str(tmp_path / "missing.json"), vocab_size=-1) as c:
        r = c.post("/v1/rollout", json=with_(prompts=[{"text": "1 + 2 x 3 ="}]))
        assert r.status_code == 422 and r.json()["field"] == "prompts[0].text"


def test_status_page_is_served(gw: TestClient) -> None:
    r = gw.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "v1/ranks" in r.text
