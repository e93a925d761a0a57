"""A whole cluster under mutual TLS: `LocalCluster(tls=True)` (what `bubblespec up --tls`
runs) makes a throwaway CA, and every child serves TLS, requires a client certificate from
that CA and presents its own to the others (ranks and gateway to the synchronizer, gateway
to the ranks). A TLS rollout passes end to end with the bearer token on top; every service
(synchronizer gRPC, both ranks, gateway) refuses a plaintext client, a client without the CA,
a client without a certificate and one with a certificate of another CA. One cluster, two
real engines on the embedded tiny model; every call has a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblespec.client import BubbleSpecClient, BubbleSpecError
from bubblespec.cluster import LocalCluster
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncUnavailable
from bubblespec.tls import channel_credentials, client_context, write_throwaway_pki
from tests.cluster.drills import check_result
from tests.cluster.helpers import local_cluster

pytestmark = [pytest.mark.engine, pytest.mark.slow]  # CI time (docs/results.md, run 17): make test-slow

TOKEN = "tls-test-token"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory, tls=True, token=TOKEN)


@pytest.fixture(scope="module")
def wrong(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Another CA and a certificate for the same hosts, which no service trusts."""
    return write_throwaway_pki(tmp_path_factory.mktemp("wrong-pki"))


def test_tls_rollout_end_to_end(cluster: LocalCluster) -> None:
    from bubblespec.tasks import default_task

    assert cluster.pki is not None and cluster.gateway_url.startswith("https://")
    assert Path(cluster.addresses()["tls_ca"]) == cluster.pki.ca
    prompts = default_task().make_prompts(4, 7)
    with BubbleSpecClient(cluster.gateway_url, token=TOKEN, timeout_s=300,
                          **cluster.client_tls()) as c:
        res = c.rollout(prompts, n=2, sampling_params={"temperature": 1.0,
                                                       "max_new_tokens": 64})
        check_result(res, prompts, 2)
        assert {r.rank_id for r in res.ranks if r.num_prompts} == {"r0", "r1"}
        ranks = c.ranks()
        assert all(r.url.startswith("https://") for r in ranks), ranks
    with BubbleSpecClient(cluster.gateway_url, timeout_s=30, **cluster.client_tls()) as c:
        with pytest.raises(BubbleSpecError) as e:  # TLS does not replace the token
            c.rollout(prompts, n=1, sampling_params={"max_new_tokens": 8})
        assert e.value.status == 401


def _refused(url: str, **kw: Any) -> None:
    with pytest.raises(httpx.TransportError) as e:
        httpx.get(url, timeout=10.0, **kw)
    assert not isinstance(e.value, httpx.TimeoutException), f"{url}: timed out, not refused"


def test_every_http_service_refuses_clients_outside_the_ca(cluster: LocalCluster,
                                                           wrong: Any) -> None:
    pki = cluster.pki
    assert pki is not None
    good = client_context(pki.ca, pki.cert, pki.key)
    urls = {"gateway": cluster.gateway_url, **cluster.rank_urls}
    assert set(urls) == {"gateway", "r0", "r1"}
    for url in urls.values():
        assert httpx.get(url + "/health", timeout=10.0, verify=good).status_code == 200
        _refused(url.replace("https://", "http://") + "/health")
        _refused(url + "/health")  # system CAs only
        _refused(url + "/health", verify=client_context(wrong.ca, pki.cert, pki.key))
        _refused(url + "/health", verify=client_context(pki.ca))
        _refused(url + "/health", verify=client_context(pki.ca, wrong.cert, wrong.key))


def test_synchronizer_refuses_clients_outside_the_ca(cluster: LocalCluster,
                                                     wrong: Any) -> None:
    pki = cluster.pki
    assert pki is not None

    async def state(creds: Any) -> Any:
        async with SyncClient(cluster.sync_address, timeout_s=5.0, credentials=creds) as c:
            return await c.get_state()

    async def body() -> None:
        snap = await state(channel_credentials(pki.ca, pki.cert, pki.key))
        assert {r.rank_id for r in snap.ranks} == {"r0", "r1"}  # registered over mTLS
        for creds in (None, channel_credentials(wrong.ca, pki.cert, pki.key),
                      channel_credentials(pki.ca),
                      channel_credentials(pki.ca, wrong.cert, wrong.key)):
            with pytest.raises(SyncUnavailable):
                await state(creds)

    asyncio.run(asyncio.wait_for(body(), 120))
