"""Property-based hostile input over every route of the gateway and of a rank (real cluster).

Bodies come from each server's `/openapi.json` and get one hostile mutation (see
`bodies.py`). Every answer must be below 500 with the `{"detail", "field"}` error shape and
must keep the connection alive; a protected route answers 401 before it reads any body;
and after the examples the server still serves a normal request. Most bodies are refused
before an engine sees them; the few that are valid run 4 tokens.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubblespec.cluster import LocalCluster
from bubblespec.tasks import default_task

from .bodies import ODD_STRINGS, body_paths, dumps, mutated
from .conftest import AUTH

pytestmark = pytest.mark.engine

IDS = list(default_task().make_prompts(1, 7)[0].input_ids)
SMALL = {"max_new_tokens": 4, "temperature": 1.0}
HYPO = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])

GATEWAY_POSTS: dict[str, dict[str, Any]] = {
    "/v1/rollout": {"prompts": [{"input_ids": IDS}], "n": 1, "sampling_params": SMALL,
                    "pregen": False},
    "/v1/weights": {"path": "/nonexistent/hostile-weights", "version": 1},
}
RANK_POSTS: dict[str, dict[str, Any]] = {
    "/generate": {"input_ids": IDS, "sampling_params": SMALL},
    "/v1/step_shard": {"step": 10**6, "requests": [{"index": 0, "input_ids": IDS,
                                                    "sampling_params": SMALL}],
                       "pregen": False, "rerun": True},
    "/v1/weights": {"path": "/nonexistent/hostile-weights", "version": 1},
    "/v1/abort_step": {"step": 10**6 + 1},
    "/v1/score": {"input_ids": [IDS]},
}
GETS = ["/health", "/health_generate", "/metrics", "/config", "/v1/state", "/v1/ranks", "/",
        "/openapi.json"]
STEP_SEGMENTS = [quote(s, safe="") for s in ["0", "1", "-1", "abc", "1e3", "0x10", "%00",
                                               str(2**53), str(2**63), "9" * 40, "NaN",
                                               *ODD_STRINGS]]


def check(r: httpx.Response, what: str) -> None:
    """Below 500, the error shape on 4xx, and the connection kept open."""
    assert r.status_code < 500, f"{what}: HTTP {r.status_code} {r.text[:400]}"
    assert r.headers.get("connection", "").lower() != "close", f"{what}: connection closed"
    if r.status_code >= 400 and r.status_code != 404:
        body = r.json()
        assert set(body) >= {"detail", "field"}, f"{what}: {body}"


def post(http: httpx.Client, url: str, body: Any, auth: bool = True) -> httpx.Response:
    headers = {"content-type": "application/json", **(AUTH if auth else {})}
    return http.post(url, content=dumps(body), headers=headers)


def fuzz_route(http: httpx.Client, url: str, base: dict[str, Any], openapi: dict,
               route: str, examples: int) -> None:
    """`examples` hostile mutations of `base`, each with and without the bearer token."""

    @given(mutated(base, body_paths(openapi, route)), st.booleans())
    @settings(HYPO, max_examples=examples)
    def run(case: tuple[str, Any], with_token: bool) -> None:
        what, body = case
        r = post(http, url, body, auth=with_token)
        check(r, f"{route}: {what}")
        if not with_token:  # auth comes before the body, whatever the body
            assert r.status_code == 401, f"{route}: {what}: {r.status_code} {r.text}"

    run()


def hostile_posts(http: httpx.Client, base_url: str, routes: dict[str, dict[str, Any]],
                  examples: int) -> None:
    openapi = http.get(f"{base_url}/openapi.json").json()
    assert set(routes) <= set(openapi["paths"]), "a route left the OpenAPI document"
    for route, base in routes.items():
        check(post(http, f"{base_url}{route}", base), f"{route} normal")
        fuzz_route(http, f"{base_url}{route}", base, openapi, route, examples)


def test_gateway_routes_refuse_hostile_bodies_with_4xx(cluster: LocalCluster,
                                                       http: httpx.Client) -> None:
    gw = cluster.gateway_url
    hostile_posts(http, gw, GATEWAY_POSTS, examples=60)
    for path in GETS:
        check(http.get(f"{gw}{path}"), path)
    for seg in STEP_SEGMENTS:
        check(http.get(f"{gw}/v1/steps/{seg}"), f"/v1/steps/{seg}")
    r = post(http, f"{gw}/v1/rollout", GATEWAY_POSTS["/v1/rollout"])
    assert r.status_code == 200, r.text
    assert len(r.json()["prompts"][0]["samples"][0]["output_ids"]) >= 1


def test_rank_routes_refuse_hostile_bodies_with_4xx(cluster: LocalCluster,
                                                    http: httpx.Client) -> None:
    rank = cluster.rank_urls["r1"]
    hostile_posts(http, rank, RANK_POSTS, examples=50)
    for path in GETS:
        if path not in ("/v1/ranks", "/"):
            check(http.get(f"{rank}{path}"), path)
    r = post(http, f"{rank}/generate", RANK_POSTS["/generate"])
    assert r.status_code == 200, r.text
    assert http.get(f"{rank}/health_generate").status_code == 200


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b"{" * 5000, b"\xff\xfe",
                                 b'{"prompts": [{"input_ids": [1e400]}]}', b"",
                                 b'{"n": 1' + b" " * 100_000 + b"}"])
def test_malformed_json_is_a_4xx(cluster: LocalCluster, http: httpx.Client, raw: bytes) -> None:
    for url in (f"{cluster.gateway_url}/v1/rollout", f"{cluster.rank_urls['r0']}/generate"):
        r = http.post(url, content=raw, headers={"content-type": "application/json", **AUTH})
        check(r, f"{url} {raw[:20]!r}")
        assert 400 <= r.status_code < 500
