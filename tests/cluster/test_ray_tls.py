"""RayCluster with mutual TLS (`bubblespec ray up --tls`): on a local Ray instance, a
throwaway CA made on the driver for the node's IP; every actor writes the PEM files on its
node and its server requires a client certificate from the CA. A TLS rollout passes end to
end, every server refuses a plaintext client, one without the CA and one without a client
certificate, and the actors' URLs are https. One rank (one engine); every call has a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bubblespec.client import BubbleSpecClient
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncUnavailable
from bubblespec.tls import channel_credentials, client_context
from tests.cluster.drills import check_result
from tests.deploy.helpers import engine_model_dir

ray = pytest.importorskip("ray")
from bubblespec.cluster.ray import RayCluster

# a second Ray cluster start; TLS itself is in `make test` on the local cluster
# (tests/integration/test_tls_cluster.py): `make test-slow`
pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama or set BUBBLESPEC_TEST_MODEL")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_memory_monitor_refresh_ms", "0")
        with RayCluster(ranks=1, model=model, num_cpus=3, name="bstls", tls=True,
                        log_dir=str(tmp_path_factory.mktemp("ray-tls-logs")),
                        start_timeout_s=300, grace_s=5) as c:
            yield c


def _refused(url: str, **kw: Any) -> None:
    with pytest.raises(httpx.TransportError) as e:
        httpx.get(url, timeout=10.0, **kw)
    assert not isinstance(e.value, httpx.TimeoutException), f"{url}: timed out, not refused"


def test_ray_tls_rollout_and_refusals(cluster: RayCluster) -> None:
    from bubblespec.tasks import default_task

    pki = cluster.pki
    assert pki is not None and cluster.gateway_url.startswith("https://")
    prompts = default_task().make_prompts(2, 5)
    with BubbleSpecClient(cluster.gateway_url, timeout_s=300, **cluster.client_tls()) as c:
        res = c.rollout(prompts, n=2, sampling_params={"temperature": 1.0,
                                                       "max_new_tokens": 32})
        check_result(res, prompts, 2)
    for url in (cluster.gateway_url, *cluster.rank_urls.values()):
        assert url.startswith("https://")
        good = client_context(pki.ca, pki.cert, pki.key)
        assert httpx.get(url + "/health", timeout=10.0, verify=good).status_code == 200
        _refused(url.replace("https://", "http://") + "/health")
        _refused(url + "/health")
        _refused(url + "/health", verify=client_context(pki.ca))

    async def sync() -> None:
        creds = channel_credentials(pki.ca, pki.cert, pki.key)
        async with SyncClient(cluster.sync_address, timeout_s=5.0, credentials=creds) as c:
            assert {r.rank_id for r in (await c.get_state()).ranks} == {"r0"}
        for bad in (None, channel_credentials(pki.ca)):
            async with SyncClient(cluster.sync_address, timeout_s=5.0, credentials=bad) as c:
                with pytest.raises(SyncUnavailable):
                    await c.get_state()

    asyncio.run(asyncio.wait_for(sync(), 120))
