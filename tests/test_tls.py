"""TLS (`bubblespec/tls.py`) on real servers on loopback: the synchronizer's gRPC server and
the shared HTTP serve path (`http/serve.py`, the gateway's real app), with a CA, server and
client certificates made here with `cryptography`, and a second CA whose certificates no
server trusts. Each service must answer a client that trusts the CA (and, under mutual TLS,
presents a certificate it signed) and refuse a plaintext client, a client without the CA, a
client without a certificate and one whose certificate comes from the wrong CA; the bearer
token still applies on top. Every call has a deadline. The rank's HTTP server runs the same
serve path; it is checked with its engine in `tests/integration/test_tls_cluster.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from bubblespec.cli import health
from bubblespec.config import ConfigError, load_config
from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.server import create_app
from bubblespec.http.serve import bind, uvicorn_server
from bubblespec.rank.config import RankConfig
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.config import SyncConfig
from bubblespec.synchronizer.errors import SyncError, SyncUnavailable
from bubblespec.synchronizer.server import SyncServer
from bubblespec.tls import (
    cert_pem,
    channel_credentials,
    client_context,
    issue,
    make_ca,
    write_issued_pki,
    write_pair,
    write_throwaway_pki,
)

HOSTS = ["localhost", "127.0.0.1"]


@dataclass(frozen=True)
class Certs:
    """The good CA, a server and a client certificate it signed, and a wrong CA with a
    certificate of its own (same host names)."""

    ca: str
    server: tuple[str, str]
    client: tuple[str, str]
    wrong_ca: str
    wrong: tuple[str, str]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("pki")
    good, bad = make_ca("good CA"), make_ca("wrong CA")
    (d / "ca.pem").write_bytes(cert_pem(good[0]))
    (d / "wrong-ca.pem").write_bytes(cert_pem(bad[0]))
    server = write_pair(d, "server", issue(good, HOSTS, "server"))
    client = write_pair(d, "client", issue(good, ["client"], "client"))
    wrong = write_pair(d, "wrong", issue(bad, HOSTS, "wrong"))
    return Certs(str(d / "ca.pem"), (str(server[0]), str(server[1])),
                 (str(client[0]), str(client[1])), str(d / "wrong-ca.pem"),
                 (str(wrong[0]), str(wrong[1])))


def tls_fields(c: Certs, client_auth: bool = True) -> dict[str, Any]:
    return {"tls_cert": c.server[0], "tls_key": c.server[1], "tls_ca": c.ca,
            "tls_client_auth": client_auth}


# ---------------------------------------------------------------------- settings
def test_settings_are_flags_env_and_checked(certs: Certs, tmp_path: Path) -> None:
    argv = ["--tls-cert", certs.server[0], "--tls-key", certs.server[1], "--tls-ca", certs.ca,
            "--tls-client-auth"]
    for model, prefix in ((SyncConfig, "BUBBLESPEC_"), (RankConfig, "BUBBLESPEC_RANK_"),
                          (GatewayConfig, "BUBBLESPEC_GATEWAY_")):
        c = load_config(model, argv, env={})
        assert (c.tls_cert, c.tls_ca, c.tls_client_auth) == (certs.server[0], certs.ca, True)
        assert c.tls_server and c.tls_client
        c = load_config(model, [], env={f"{prefix}TLS_CA": certs.ca}, env_prefix=prefix)
        assert c.tls_client and not c.tls_server
        with pytest.raises(ConfigError, match="tls_cert and tls_key go together"):
            load_config(model, ["--tls-cert", certs.server[0]], env={})
        with pytest.raises(ConfigError, match="tls_client_auth needs"):
            load_config(model, ["--tls-cert", certs.server[0], "--tls-key", certs.server[1],
                                "--tls-client-auth"], env={})
        with pytest.raises(ConfigError, match="no such file"):
            load_config(model, ["--tls-ca", str(tmp_path / "missing.pem")], env={})


def test_throwaway_pki_files(tmp_path: Path) -> None:
    from cryptography import x509

    pki = write_throwaway_pki(tmp_path / "tls", hosts=["localhost", "127.0.0.1", "example"])
    assert stat.S_IMODE(os.stat(pki.key).st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(pki.cert.read_bytes())
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "example"}
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert pki.flags()[-1] == "--tls-client-auth" and pki.settings()["tls_ca"] == str(pki.ca)
    assert not list(tmp_path.rglob("ca-key*")), "the CA's key is not kept"


def test_issued_pki_is_signed_by_the_given_ca(tmp_path: Path) -> None:
    from cryptography import x509

    ca_cert, ca_key = write_pair(tmp_path / "issuer", "ca", make_ca("issuer"))
    pki = write_issued_pki(tmp_path / "out", ca_cert, ca_key, ["10.0.0.7", "head-svc"])
    assert pki.ca.read_bytes() == ca_cert.read_bytes()
    cert = x509.load_pem_x509_certificate(pki.cert.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_cert.read_bytes()))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["head-svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    client_context(pki.ca, pki.cert, pki.key)  # loads as a chain + key


# ---------------------------------------------------------------------- synchronizer (gRPC)
def _run(coro: Any, timeout_s: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def _sync_config(**kw: Any) -> SyncConfig:
    return SyncConfig(port=0, metrics_port=-1, shutdown_grace_s=0.2, **kw)


async def _get_state(address: str, credentials: Any, token: str | None = None) -> Any:
    async with SyncClient(address, token=token, timeout_s=3.0, credentials=credentials) as c:
        return await c.get_state()


def test_sync_mutual_tls_accepts_the_ca_and_refuses_the_rest(certs: Certs) -> None:
    async def body() -> None:
        async with SyncServer(_sync_config(**tls_fields(certs), token="s3cret")) as server:
            addr = f"localhost:{server.port}"
            good = channel_credentials(certs.ca, *certs.client)
            snap = await _get_state(addr, good)
            assert snap.ranks == []
            refused = {
                "plaintext": None,
                "without the CA": channel_credentials(certs.wrong_ca, *certs.client),
                "without a client certificate": channel_credentials(certs.ca),
                "with a certificate of the wrong CA": channel_credentials(certs.ca,
                                                                          *certs.wrong),
            }
            for why, creds in refused.items():
                t0 = time.monotonic()
                with pytest.raises(SyncUnavailable) as e:
                    await _get_state(addr, creds)
                assert e.value.code is grpc.StatusCode.UNAVAILABLE, why
                assert time.monotonic() - t0 < 3.0, f"{why}: refused, not timed out"
            # the bearer token still applies on top of TLS
            async with SyncClient(addr, timeout_s=3.0, credentials=good) as c:
                with pytest.raises(SyncError) as e:
                    await c.register("r0", "127.0.0.1:1")
                assert e.value.code is grpc.StatusCode.UNAUTHENTICATED
            async with SyncClient(addr, token="s3cret", timeout_s=3.0, credentials=good) as c:
                assert (await c.register("r0", "127.0.0.1:1")).instance_id

    _run(body())


def test_sync_server_tls_without_client_certificates(certs: Certs) -> None:
    async def body() -> None:
        async with SyncServer(_sync_config(**tls_fields(certs, client_auth=False))) as server:
            addr = f"127.0.0.1:{server.port}"  # the IP address is a SAN too
            await _get_state(addr, channel_credentials(certs.ca))
            with pytest.raises(SyncUnavailable):
                await _get_state(addr, None)
            with pytest.raises(SyncUnavailable):
                await _get_state(addr, channel_credentials(certs.wrong_ca))

    _run(body())


def test_health_probe_speaks_tls_to_the_synchronizer(certs: Certs) -> None:
    ready = threading.Event()
    done: asyncio.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    port = 0

    async def serve() -> None:
        nonlocal done, loop, port
        done, loop = asyncio.Event(), asyncio.get_running_loop()
        async with SyncServer(_sync_config(**tls_fields(certs))) as server:
            port = server.port
            ready.set()
            await asyncio.wait_for(done.wait(), 60)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(30)
        addr = f"localhost:{port}"
        tls = ["--tls-ca", certs.ca, "--tls-cert", certs.client[0], "--tls-key",
               certs.client[1]]
        assert health.main(["--grpc", addr, "--timeout-s", "3", *tls]) == health.HEALTHY
        assert health.main(["--grpc", addr, "--timeout-s", "3"]) == health.UNHEALTHY
        assert health.main(["--grpc", addr, "--timeout-s", "3", "--tls-ca", certs.ca]
                           ) == health.UNHEALTHY
        assert health.main(["--grpc", addr, "--tls-cert", certs.client[0]]) == health.USAGE
    finally:
        assert loop is not None and done is not None
        loop.call_soon_threadsafe(done.set)
        thread.join(30)


# ---------------------------------------------------------------------- HTTP (gateway app)
@contextlib.contextmanager
def serving_http(config: Any, app: Any) -> Iterator[int]:
    """Serve `app` through the shared serve path (`uvicorn_server`) in a thread; its port."""
    sock = bind("127.0.0.1", 0)
    server = uvicorn_server(config.model_copy(update={"log_level": "WARNING"}), app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def assert_http_refused(url: str, why: str, **kw: Any) -> None:
    """A GET of `url` fails at the connection (TLS) level, well before its deadline."""
    t0 = time.monotonic()
    with pytest.raises(httpx.TransportError) as e:
        httpx.get(url, timeout=5.0, **kw)
    assert not isinstance(e.value, httpx.TimeoutException), f"{why}: timed out, not refused"
    assert time.monotonic() - t0 < 5.0, why


def check_http_service(url: str, certs: Certs, client_auth: bool) -> None:
    """The HTTPS server at `url` (https://host:port) answers a client with the CA (and client
    certificate) and refuses the rest."""
    good = client_context(certs.ca, *certs.client)
    r = httpx.get(url + "/metrics", timeout=5.0, verify=good)
    assert r.status_code == 200
    assert_http_refused(url.replace("https://", "http://") + "/metrics", "plaintext")
    assert_http_refused(url + "/metrics", "without the CA")  # the system CAs only
    assert_http_refused(url + "/metrics", "wrong CA trusted",
                        verify=client_context(certs.wrong_ca, *certs.client))
    if client_auth:
        assert_http_refused(url + "/metrics", "no client certificate",
                            verify=client_context(certs.ca))
        assert_http_refused(url + "/metrics", "client certificate of the wrong CA",
                            verify=client_context(certs.ca, *certs.wrong))
    else:
        assert httpx.get(url + "/metrics", timeout=5.0,
                         verify=client_context(certs.ca)).status_code == 200


@pytest.mark.parametrize("client_auth", [True, False])
def test_gateway_https(certs: Certs, client_auth: bool) -> None:
    cfg = GatewayConfig(port=0, **tls_fields(certs, client_auth), token="s3cret")
    with serving_http(cfg, create_app(cfg)) as port:
        url = f"https://localhost:{port}"
        check_http_service(url, certs, client_auth)
        # the bearer token still guards the mutating routes over TLS
        r = httpx.post(url + "/v1/rollout", json={}, timeout=5.0,
                       verify=client_context(certs.ca, *certs.client))
        assert r.status_code == 401
        # the health probe, with and without the CA
        tls = ["--tls-ca", certs.ca, "--tls-cert", certs.client[0], "--tls-key",
               certs.client[1]]
        metrics = f"localhost:{port}/metrics"
        assert health.main(["--http", f"https://{metrics}", "--timeout-s", "3", *tls]
                           ) == health.HEALTHY
        assert health.main(["--http", f"https://{metrics}", "--timeout-s", "3"]
                           ) == health.UNHEALTHY
        assert health.main(["--http", metrics, "--timeout-s", "3"]) == health.UNHEALTHY


def test_bubblespec_client_verifies_the_gateway(certs: Certs) -> None:
    from bubblespec.client import BubbleSpecClient, BubbleSpecUnavailable

    cfg = GatewayConfig(port=0, **tls_fields(certs))
    with serving_http(cfg, create_app(cfg)) as port:
        with BubbleSpecClient(f"localhost:{port}", ca=certs.ca, cert=certs.client[0],
                              key=certs.client[1], timeout_s=5) as c:
            assert c.base_url.startswith("https://")
            assert c.ranks() == []
        for kw in ({}, {"ca": certs.wrong_ca, "cert": certs.client[0], "key": certs.client[1]},
                   {"ca": certs.ca}):
            with (BubbleSpecClient(f"https://localhost:{port}", timeout_s=5, **kw) as c,
                  pytest.raises(BubbleSpecUnavailable)):
                c.ranks()
    with pytest.raises(ValueError, match="needs ca="):
        BubbleSpecClient("localhost:1", cert=certs.client[0], key=certs.client[1])
