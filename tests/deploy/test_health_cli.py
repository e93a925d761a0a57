"""`bubblespec health`: exit 0 when healthy, 1 when not (with a message that says why), 2 on
bad usage; deadlines hold against a peer that accepts connections and never answers."""

from __future__ import annotations

import contextlib
import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bubblespec.cli import health as hc
from bubblespec.cli.main import main as cli_main
from bubblespec.cluster import free_ports
from tests.deploy.helpers import REPO


def probe(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(["health", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@contextlib.contextmanager
def grpc_health_server(status: int) -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", status)
    servicer.set("bubblespec.rpc.v1.Synchronizer", status)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(0)


@contextlib.contextmanager
def silent_listener() -> Iterator[str]:
    """A TCP port that accepts connections and never says a word."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield f"127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


@contextlib.contextmanager
def http_server(status: int, body: bytes = b'{"status": "ready"}') -> Iterator[str]:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/health_generate" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_grpc_serving_and_not_serving(capsys: pytest.CaptureFixture[str]) -> None:
    with grpc_health_server(health_pb2.HealthCheckResponse.SERVING) as (addr, servicer):
        code, out, _ = probe(capsys, "--grpc", addr)
        assert code == 0 and "SERVING" in out
        code, out, _ = probe(capsys, "--grpc", addr, "--service",
                             "bubblespec.rpc.v1.Synchronizer", "--quiet")
        assert code == 0 and out == ""
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        code, _, err = probe(capsys, "--grpc", addr)
        assert code == 1 and "NOT_SERVING" in err and addr in err
        code, _, err = probe(capsys, "--grpc", addr, "--service", "nope")
        assert code == 1 and "does not know this service" in err


def test_grpc_unreachable_and_deadline(capsys: pytest.CaptureFixture[str]) -> None:
    (port,) = free_ports(1)
    code, _, err = probe(capsys, "--grpc", f"127.0.0.1:{port}", "--timeout-s", "2")
    assert code == 1 and ("unreachable" in err or "no answer" in err), err
    with silent_listener() as addr:
        t0 = time.monotonic()
        code, _, err = probe(capsys, "--grpc", addr, "--timeout-s", "0.5")
        took = time.monotonic() - t0
    assert code == 1 and took < 5, (took, err)
    assert "0.5 s" in err or "unreachable" in err, err


def test_http_ready_not_ready_and_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    with http_server(200) as addr:
        code, out, _ = probe(capsys, "--http", f"http://{addr}/health_generate")
        assert code == 0 and "200" in out
        code, out, _ = probe(capsys, "--http", addr)  # host:port -> /health_generate
        assert code == 0 and f"http://{addr}/health_generate" in out
    with http_server(503, b'{"status": "starting", "detail": "engine is starting"}') as addr:
        code, _, err = probe(capsys, "--http", f"http://{addr}/health_generate")
        assert code == 1 and "HTTP 503" in err and "engine is starting" in err
    (port,) = free_ports(1)
    code, _, err = probe(capsys, "--http", f"http://127.0.0.1:{port}/health_generate")
    assert code == 1 and "unreachable" in err


def test_http_deadline(capsys: pytest.CaptureFixture[str]) -> None:
    with silent_listener() as addr:
        t0 = time.monotonic()
        code, _, err = probe(capsys, "--http", addr, "--timeout-s", "0.5")
        took = time.monotonic() - t0
    assert code == 1 and took < 5 and "no answer within 0.5 s" in err, (took, err)


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert probe(capsys)[0] == 2
    assert probe(capsys, "--grpc", "a:1", "--http", "b:2")[0] == 2
    code, _, err = probe(capsys, "--grpc", "http://a:1")
    assert code == 2 and "HOST:PORT" in err
    assert probe(capsys, "--http", "ftp://a/b")[0] == 2
    assert probe(capsys, "--http", "a:1", "--timeout-s", "0")[0] == 2
    assert probe(capsys, "--help")[0] == 0


def test_normalise_url() -> None:
    assert hc.normalise_url("h:1") == "http://h:1/health_generate"
    assert hc.normalise_url("http://h:1") == "http://h:1/health_generate"
    assert hc.normalise_url("http://h:1/health") == "http://h:1/health"


def test_against_a_real_synchronizer(tmp_path: Path) -> None:
    """The probe the compose file and images use, against `bubblespec sync` itself."""
    (port,) = free_ports(1)
    log = open(tmp_path / "sync.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "bubblespec.cli.main", "sync", "--port", str(port),
         "--metrics-port", "-1", "--shutdown-grace-s", "0"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    argv = [sys.executable, "-m", "bubblespec.cli.main", "health", "--grpc",
            f"127.0.0.1:{port}", "--timeout-s", "1"]
    try:
        deadline = time.monotonic() + 30
        while True:
            r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=30,
                               check=False)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            assert proc.poll() is None, (tmp_path / "sync.log").read_text()
            time.sleep(0.3)
        assert r.returncode == 0 and "SERVING" in r.stdout, (r.stdout, r.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=30,
                               check=False)
    assert r.returncode == 1 and "UNHEALTHY" in r.stderr
