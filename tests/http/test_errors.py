"""Error bodies of the shared HTTP edge: fields named as the request spells them.

Exercised on the real rank app (its engine never starts here: valid bodies answer 503
`engine`, so everything below is the edge's own answer) and on `error_field` directly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from bubblespec.http.errors import error_field
from bubblespec.protocol.errors import ApiError
from bubblespec.rank.config import RankConfig
from bubblespec.rank.server import create_app

TOKEN = "tkn"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def rank() -> Iterator[TestClient]:
    # no `with`: the lifespan (which would start vLLM) never runs
    yield TestClient(create_app(RankConfig(port=0, token=TOKEN)), raise_server_exceptions=False)


@pytest.mark.parametrize(("route", "body", "field"), [
    ("/v1/step_shard", {"step": 1, "requests": [{"index": 0, "input_ids": [1, "x"]}]},
     "requests[0].input_ids[1]"),
    ("/v1/step_shard", {"step": 1, "requests": [{"index": 0, "input_ids": [1]}, {"index": 1}]},
     "requests[1].input_ids"),
    ("/v1/step_shard", {"step": 1, "requests": [{"index": 0, "input_ids": [1],
                                                 "sampling_params": {"top_k": -5}}]},
     "requests[0].sampling_params.top_k"),
    ("/v1/step_shard", {"step": -1}, "step"),
    ("/v1/step_shard", {"step": 1, "bogus": 2}, "bogus"),
    # union input (one prompt or a batch): the member tags never show in the field
    ("/generate", {"input_ids": [1, "x"]}, "input_ids[1]"),
    ("/generate", {"input_ids": [[1], [2, "y"]]}, "input_ids[1][1]"),
    ("/generate", {"input_ids": "abc"}, "input_ids"),
    ("/generate", {"input_ids": [1], "n": 0}, "n"),
    ("/v1/weights", {"path": "/x", "version": -1}, "version"),
])
def test_validation_names_the_field_as_the_request_spells_it(
        rank: TestClient, route: str, body: dict, field: str) -> None:
    r = rank.post(route, json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    got = r.json()
    assert got["field"] == field and got["detail"].startswith(f"{field}: "), got
    assert all("list[" not in e["field"] for e in got["errors"]), got


@pytest.mark.parametrize("raw", [b"{", b'{"step": 1,', b"\xff\xfe", b"[1, 2]", b""])
def test_malformed_json_is_422_on_body(rank: TestClient, raw: bytes) -> None:
    r = rank.post("/v1/step_shard", content=raw,
                  headers={"content-type": "application/json", **AUTH})
    assert r.status_code == 422 and r.json()["field"] == "body", r.text


def test_valid_body_before_the_engine_is_up_is_503_on_engine(rank: TestClient) -> None:
    r = rank.post("/generate", json={"input_ids": [1, 2]}, headers=AUTH)
    assert r.status_code == 503 and r.json() == {"detail": "engine is starting",
                                                 "field": "engine"}


def test_unknown_route_and_method_keep_the_shape(rank: TestClient) -> None:
    r = rank.get("/v1/nothing")
    assert r.status_code == 404 and set(r.json()) == {"detail", "field"}
    r = rank.get("/v1/step_shard")
    assert r.status_code == 405 and set(r.json()) == {"detail", "field"}


@pytest.mark.parametrize(("error", "body", "field"), [
    ({"loc": ("body", "prompts", 2, "input_ids", 5)},
     {"prompts": [{}, {}, {"input_ids": [0] * 6}]}, "prompts[2].input_ids[5]"),
    ({"loc": ("body", "input_ids", "list[int]", 1)}, {"input_ids": [1, "x"]}, "input_ids[1]"),
    ({"loc": ("body", "input_ids", "list[list[int]]", 1, 0)}, {"input_ids": [[1], ["x"]]},
     "input_ids[1][0]"),
    ({"loc": ("body", "requests", 0, "index"), "type": "missing"}, {"requests": [{}]},
     "requests[0].index"),
    ({"loc": ("body", 17), "type": "json_invalid"}, "{", "body"),
    ({"loc": ("body",), "type": "model_attributes_type"}, [1, 2], "body"),
    ({"loc": ("path", "step")}, None, "step"),
    ({"loc": ("query", "ids", 3)}, None, "ids[3]"),
])
def test_error_field(error: dict, body: object, field: str) -> None:
    assert error_field(error, body) == field


def test_api_error_carries_status_field_and_headers() -> None:
    e = ApiError(401, "no", "authorization", {"WWW-Authenticate": "Bearer"})
    assert (e.status, e.detail, e.field, e.headers) == (401, "no", "authorization",
                                                        {"WWW-Authenticate": "Bearer"})
    assert str(e) == "401: no (field authorization)"
