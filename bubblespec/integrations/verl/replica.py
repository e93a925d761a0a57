"""`BubbleSpecReplica`: verl's `RolloutReplica` for `actor_rollout_ref.rollout.name=bubblespec`.

verl's `LLMServerManager` makes `world_size / rollout_world_size` replicas and calls one of
`init_hybrid`, `init_colocated` or `init_standalone` on each; each replica's
`launch_servers` must set `_server_handle` (the actor `generate` calls go to) and
`_server_address`. Here every replica gets the same named `BubbleSpecServer` actor (created
by the first, found by the others: Ray's `get_if_exists`), which starts one bubblespec
cluster for the whole rollout: the gateway shards each step over all ranks, so verl's
load balancer sees a single server.

Placement: the ranks are `RayCluster` actors on their own placement group, one bundle per
rank (`{"GPU": 1, "CPU": c}` where the Ray cluster has GPUs), so they need devices of their
own, as in verl's standalone mode. In hybrid mode (trainer and rollout sharing devices)
the ranks do not share the trainer's devices: the bubblespec engines are separate
processes that do not sleep while the trainer trains (their pre-generation may use that
window), so the Ray cluster needs free devices for them; without any the placement group
is not placed and the start fails after `start_timeout_s` naming the free resources.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from bubblespec.integrations.verl.server import BubbleSpecServer
from bubblespec.integrations.verl.settings import NAMESPACE, SERVER_NAME, BubbleSpecSettings


def model_path(model_config: Any) -> str:
    """The model directory of verl's model config (its local copy when it made one)."""
    path = getattr(model_config, "local_path", None) or getattr(model_config, "path", None)
    if not path:
        raise ValueError("actor_rollout_ref.model.path is not set")
    return str(path)


def rank_count(settings: BubbleSpecSettings, devices: int, tp: int) -> int:
    """Ranks to start: the setting, else one per `tp` rollout devices (at least one)."""
    if settings.ranks is not None:
        return settings.ranks
    return max(1, devices // max(1, tp))


class BubbleSpecReplica(RolloutReplica):
    """A verl rollout replica served by the one bubblespec cluster (module docstring)."""

    _devices: int = 0

    async def init_hybrid(self, worker_group: Any) -> None:
        self.rollout_mode = RolloutMode.HYBRID
        self._devices = int(worker_group.world_size)
        await self.launch_servers()

    async def init_hybrid_colocated(self, worker_group: Any, resource_pool: Any) -> None:
        self.rollout_mode = RolloutMode.HYBRID
        self._devices = int(worker_group.world_size)
        await self.launch_servers()

    async def init_colocated(self, resource_pool: Any) -> None:
        self.rollout_mode = RolloutMode.COLOCATED
        self._devices = int(resource_pool.world_size)
        await self.launch_servers()

    async def init_standalone(self) -> None:
        """The ranks reserve their own bundles (no verl resource pool or CUDA workers)."""
        self.rollout_mode = RolloutMode.STANDALONE
        self._devices = self.config.n_gpus_per_node * max(1, self.config.nnodes)
        await self.launch_servers()

    async def launch_servers(self) -> None:
        settings = BubbleSpecSettings.from_rollout_config(self.config)
        tp = self.config.tensor_model_parallel_size
        ranks = rank_count(settings, self._devices, tp)
        server = ray.remote(BubbleSpecServer).options(
            name=SERVER_NAME, namespace=NAMESPACE, get_if_exists=True, num_cpus=0,
            max_concurrency=self.max_concurrency,
        ).remote(settings.model_dump(mode="json"), model_path(self.model_config), ranks, tp,
                 self.config.response_length)
        self._server_address = await server.gateway_url.remote()
        self._server_handle = server
        self.servers = [server]

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return await self._server_handle.abort_all_requests.remote(reject_request=reject_request)

    async def abort_request(self, request_id: str) -> dict[str, Any]:
        """A single trajectory cannot leave a running step: it finishes with its step."""
        return {"aborted": False, "request_id": request_id,
                "error": "bubblespec runs a batch as one step; it finishes with the step"}
