"""verl 0.9.1's own generation path against bubblespec ranks on a local Ray cluster (CPU,
the embedded model, 2 ranks).

What runs is verl's code: `LLMServerManager.create` (standalone mode: two verl replicas,
both served by the one bubblespec server actor, which starts a `RayCluster`), its load
balancer and `LLMServerClient.generate`, and `AgentLoopManager.generate_sequences` (our
subclass, the next-batch hook) with verl's `AgentLoopWorker` actors running its
`SingleTurnAgentLoop` over batches from the train dataloader verl's trainer builds, steps
numbered as `RayPPOTrainer.fit` numbers them; between the two steps the trainer-side
adapter pushes the trainer's weights (bf16 named tensors, as FSDP yields them).

Not run here: verl's FSDP trainer workers (they need CUDA and NCCL; the adapter they call is
driven directly with the tensors they would yield) and `RayPPOTrainer.fit` itself (its
dataflow is reproduced step for step: dataloader batch -> uid -> global_steps -> repeat n,
interleaved -> generate_sequences -> weight push).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

verl = pytest.importorskip("verl")
ray = pytest.importorskip("ray")

import bubblespec.integrations.verl.plugin  # noqa: F401  (registers the backend here)
from bubblespec.client import BubbleSpecClient
from bubblespec.integrations.verl.adapter import BubbleSpecServerAdapter
from bubblespec.integrations.verl.settings import NAMESPACE, SERVER_NAME
from tests.cluster.helpers import REPO_ROOT
from tests.deploy.helpers import engine_model_dir
from tests.integrations.verl_helpers import (
    trainer_loader,
    trainer_weights,
    verl_config,
    write_dataset,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]

BATCH, N = 4, 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama or set BUBBLESPEC_TEST_MODEL")
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.llm_server import LLMServerManager

    from bubblespec.integrations.verl.hook import BubbleSpecAgentLoopManager

    tmp = tmp_path_factory.mktemp("verl")
    prompts = write_dataset(tmp / "train.parquet", 2 * BATCH, 5)
    cfg = verl_config(model, tmp / "train.parquet", BATCH, N, response_length=200,
                      seed_mode="keyed", weights_dir=str(tmp / "weights"),
                      log_dir=str(tmp / "logs"), start_timeout_s=600)
    cfg.actor_rollout_ref.rollout.nnodes = 1  # standalone: 2 devices, tp 1 -> 2 replicas
    cfg.actor_rollout_ref.rollout.n_gpus_per_node = 2
    with pytest.MonkeyPatch.context() as mp:
        # the Ray workers (verl's agent-loop workers, our server) load the plugin and this
        # checkout; Ray's memory monitor would kill workers on this shared host
        mp.setenv("VERL_USE_EXTERNAL_MODULES", "bubblespec.integrations.verl.plugin")
        mp.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        mp.setenv("RAY_memory_monitor_refresh_ms", "0")
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
        server = None
        try:
            servers = LLMServerManager.create(config=cfg, worker_group=None)
            server = ray.get_actor(SERVER_NAME, namespace=NAMESPACE)
            manager = BubbleSpecAgentLoopManager.create(
                config=cfg, llm_client=servers.get_client(), teacher_client=None,
                reward_loop_worker_handles=None)
            model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
            yield {"cfg": cfg, "servers": servers, "server": server, "manager": manager,
                   "loader": trainer_loader(cfg, model_config), "prompts": prompts,
                   "url": ray.get(server.gateway_url.remote())}
        finally:
            if server is not None:
                ray.get(server.shutdown.remote(), timeout=120)
            ray.shutdown()


def test_one_server_serves_every_replica(setup: dict[str, Any]) -> None:
    replicas = setup["servers"].get_replicas()
    assert len(replicas) == 2
    assert len({r.server_address for r in replicas}) == 1
    with BubbleSpecClient(setup["url"]) as c:
        assert len(c.ranks()) == 2


def test_llm_server_client_generate_returns_token_output_with_logprobs(
        setup: dict[str, Any]) -> None:
    from verl.workers.rollout.replica import TokenOutput

    client = setup["servers"].get_client()
    ids = list(setup["prompts"][0].input_ids)
    out = asyncio.run(client.generate(uuid.uuid4().hex, prompt_ids=ids, sampling_params={
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
        "logprobs": True}))
    assert isinstance(out, TokenOutput)
    assert out.token_ids and out.stop_reason == "completed"
    assert out.log_probs is not None and len(out.log_probs) == len(out.token_ids)
    assert all(lp <= 0.0 for lp in out.log_probs)


def test_agent_loop_steps_with_a_weight_push_and_pregenerated_next_batch(
        setup: dict[str, Any]) -> None:
    from verl.protocol import DataProto

    cfg, server, manager = setup["cfg"], setup["server"], setup["manager"]
    adapter = BubbleSpecServerAdapter(config=cfg.actor_rollout_ref.rollout,
                                      model_config=cfg.actor_rollout_ref.model,
                                      device_mesh=None)
    outputs, steps_before = [], len(ray.get(server.steps.remote()))
    for global_steps, batch_dict in enumerate(setup["loader"], start=1):
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))],
                                                 dtype=object)
        batch.meta_info["global_steps"] = global_steps
        gen = batch.repeat(repeat_times=N, interleave=True)
        outputs.append(manager.generate_sequences(gen))
        pushed = asyncio.run(adapter.update_weights(iter(trainer_weights()),
                                                    global_steps=global_steps))
        assert set(pushed["ranks"].values()) == {global_steps + 1}, pushed
    assert len(outputs) == 2
    for out in outputs:
        assert out.batch["responses"].shape[0] == BATCH * N
        mask = out.batch["response_mask"]
        assert int(mask.sum()) > 0
        lps = out.batch["rollout_log_probs"]
        assert bool((lps[mask.bool()] <= 0).all())
    steps = ray.get(server.steps.remote())[steps_before:]
    print("verl steps:", json.dumps(steps))  # the figures docs/results.md quotes, "verl" (pytest -s)
    assert [s["samples"] for s in steps] == [BATCH * N, BATCH * N]  # one step per batch
    assert steps[1]["step"] == steps[0]["step"] + 1
    # the second batch was pre-generated in the first step's bubble and fetched by the ranks
    assert steps[1]["counters"]["drafts_fetched_tokens"] > 0, steps[1]
    # the second step ran on the weights pushed after the first
    versions = outputs[1].non_tensor_batch["weight_version"]
    assert set(versions.tolist()) == {2}
    with BubbleSpecClient(setup["url"]) as c:
        assert {r.weight_version for r in c.ranks()} == {3}
    # the same push handed over in shared memory (`weight_sync: tensors`, one host)
    from omegaconf import OmegaConf, open_dict

    rollout = copy.deepcopy(cfg.actor_rollout_ref.rollout)
    with open_dict(rollout):
        rollout.engine_kwargs.bubblespec.weight_sync = "tensors"
    by_tensors = BubbleSpecServerAdapter(config=rollout, model_config=cfg.actor_rollout_ref.model,
                                         device_mesh=None)
    assert OmegaConf.select(rollout, "engine_kwargs.bubblespec.weight_sync") == "tensors"
    pushed = asyncio.run(by_tensors.update_weights(iter(trainer_weights()), global_steps=3))
    assert pushed["weight_version"] == 4
    with BubbleSpecClient(setup["url"]) as c:
        assert {r.weight_version for r in c.ranks()} == {4}
