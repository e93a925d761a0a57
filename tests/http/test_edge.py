"""The shared edge on both servers: auth before the body, the streaming body limit, and a
500 that keeps the keep-alive connection usable.

The rank and gateway apps run in-process without their lifespans (no engine, no clients):
what is checked here happens before a route reaches its service. The 500 needs a route
that fails unexpectedly, so that check serves a small app of its own through the same
`build_app` over a real uvicorn server and a raw keep-alive socket.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.server import create_app as gateway_app
from bubblespec.http.edge import UNAUTHORIZED, build_app, protected_router
from bubblespec.rank.config import RankConfig
from bubblespec.rank.server import create_app as rank_app
from tests.serving import serve_app

TOKEN = "s3cret"
LIMIT = 4096
JSON = {"content-type": "application/json"}

# each server's protected routes, with a body its validation would refuse
PROTECTED = {
    "rank": [("/v1/step_shard", {"step": -1}), ("/generate", {}), ("/v1/weights", {})],
    "gateway": [("/v1/rollout", {"prompts": []}), ("/v1/weights", {"path": ""})],
}


@pytest.fixture(scope="module", params=["rank", "gateway"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, TestClient]]:
    if request.param == "rank":
        app = rank_app(RankConfig(port=0, token=TOKEN, max_body_bytes=LIMIT))
    else:
        app = gateway_app(GatewayConfig(port=0, token=TOKEN, max_body_bytes=LIMIT))
    yield request.param, TestClient(app, raise_server_exceptions=False)


def test_auth_comes_before_the_body(server: tuple[str, TestClient]) -> None:
    name, c = server
    for route, bad in PROTECTED[name]:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN},
                        {"authorization": "Bearer s3cr\u00e9t".encode()}):
            for content in (b"{", b"\xff", b"[1, 2]", b""):  # malformed: still 401, not 422
                r = c.post(route, content=content, headers={**JSON, **headers})
                assert r.status_code == 401, (route, headers, content, r.text)
                assert r.json() == {"detail": UNAUTHORIZED, "field": "authorization"}
                assert r.headers["www-authenticate"] == "Bearer"
            r = c.post(route, json=bad, headers=headers)
            assert r.status_code == 401, (route, r.text)
        r = c.post(route, json=bad, headers={"authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 422, (route, r.text)  # with the token: the body's turn


def test_read_routes_need_no_token(server: tuple[str, TestClient]) -> None:
    _, c = server
    assert c.get("/health").json() == {"status": "ok"}
    assert TOKEN not in c.get("/config").text


def test_body_limit_by_content_length_and_while_streaming(
        server: tuple[str, TestClient]) -> None:
    name, c = server
    route = PROTECTED[name][0][0]
    auth = {"authorization": f"Bearer {TOKEN}", **JSON}
    r = c.post(route, content=b" " * (LIMIT + 1), headers=auth)
    assert r.status_code == 413 and r.json()["field"] == "body", r.text

    def chunks() -> Iterator[bytes]:  # no content-length: chunked, counted as it streams
        yield b'{"step": 1, "requests": ['
        for _ in range(LIMIT // 8):
            yield b"1, 2, 3,"
        yield b"4]}"

    r = c.post(route, content=chunks(), headers=auth)
    assert r.status_code == 413 and r.json()["field"] == "body", r.text


def test_the_same_auth_answer_on_both_servers() -> None:
    rank = TestClient(rank_app(RankConfig(port=0, token=TOKEN)))
    gateway = TestClient(gateway_app(GatewayConfig(port=0, token=TOKEN)))
    a = rank.post("/v1/weights", json={"path": "/x"})
    b = gateway.post("/v1/weights", json={"path": "/x"})
    assert (a.status_code, a.json(), a.headers["www-authenticate"]) == (
        b.status_code, b.json(), b.headers["www-authenticate"])


class _Nothing:
    """A service with nothing to start or stop."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def _crashing_app() -> FastAPI:
    public, protected = APIRouter(), protected_router()

    @public.get("/boom")
    async def boom() -> dict[str, str]:
        raise RuntimeError("kaput")

    @protected.post("/echo")
    async def echo(body: dict[str, int]) -> dict[str, int]:
        return body

    @public.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return build_app("test", _Nothing(), [public, protected], token=TOKEN,
                     max_body_bytes=LIMIT)


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on `sock`, read one response (content-length framed)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed; got {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(v) for k, _, v in (x.partition(":") for x in lines[1:])
                  if k.lower() == "content-length")
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    assert b"connection: close" not in head.lower()
    return int(lines[0].split()[1]), body


@pytest.fixture(scope="module")
def live_url() -> Iterator[tuple[str, int]]:
    with serve_app(_crashing_app(), log_level="critical") as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def test_a_500_is_json_and_keeps_the_connection(live_url: tuple[str, int]) -> None:
    host = live_url[0]
    get = f"GET /{{}} HTTP/1.1\r\nhost: {host}\r\n\r\n"
    with socket.create_connection(live_url, timeout=10) as sock:
        status, body = _exchange(sock, get.format("boom").encode())
        assert status == 500 and b"RuntimeError: kaput" in body and b'"field":""' in body
        for _ in range(2):  # the same connection goes on serving
            assert _exchange(sock, get.format("health").encode()) == (200, b'{"status":"ok"}')
        status, body = _exchange(sock, (
            f"POST /echo HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {TOKEN}\r\n"
            "content-type: application/json\r\ncontent-length: 8\r\n\r\n{\"a\": 1}").encode())
        assert (status, body) == (200, b'{"a":1}')
