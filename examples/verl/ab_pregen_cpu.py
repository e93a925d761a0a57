"""A/B of the next-batch hook on verl's own generation path (CPU, the embedded model).

Two GRPO steps (4 prompts x n=2, keyed sampling, a weight push after each) through verl
0.9.1's `LLMServerManager`, load balancer and agent loop against 2 bubblespec ranks on a
local Ray cluster, with the hook's pre-generation on or off; prints each step's counters
and a digest of its response tokens (keyed sampling: the digests of `on` and `off` must be
equal). Run from a checkout (it uses the tests' verl config and dataset helpers):

    PYTHONPATH=. python examples/verl/ab_pregen_cpu.py off
    PYTHONPATH=. python examples/verl/ab_pregen_cpu.py on
"""

import asyncio
import hashlib
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import ray
from verl.protocol import DataProto
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.llm_server import LLMServerManager

import bubblespec.integrations.verl.plugin  # noqa: F401  (registers the backend)
from bubblespec.integrations.verl.adapter import BubbleSpecServerAdapter
from bubblespec.integrations.verl.hook import BubbleSpecAgentLoopManager
from bubblespec.integrations.verl.settings import NAMESPACE, SERVER_NAME
from bubblespec.tasks import default_model_dir
from tests.integrations.verl_helpers import (
    trainer_loader,
    trainer_weights,
    verl_config,
    write_dataset,
)

KEYS = ("completion_tokens", "decode_steps_critical", "request_decode_steps",
        "drafts_fetched_tokens", "num_accepted_pregen_tokens", "tokens_per_forward")


def main(pregen: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="verl-ab-"))
    write_dataset(tmp / "train.parquet", 8, 5)
    cfg = verl_config(str(default_model_dir()), tmp / "train.parquet", 4, 2,
                      response_length=200, seed_mode="keyed", weights_dir=str(tmp / "w"),
                      log_dir=str(tmp / "logs"), pregen=pregen)
    cfg.actor_rollout_ref.rollout.nnodes = 1
    cfg.actor_rollout_ref.rollout.n_gpus_per_node = 2
    os.environ["VERL_USE_EXTERNAL_MODULES"] = "bubblespec.integrations.verl.plugin"
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    servers = LLMServerManager.create(config=cfg, worker_group=None)
    server = ray.get_actor(SERVER_NAME, namespace=NAMESPACE)
    manager = BubbleSpecAgentLoopManager.create(config=cfg, llm_client=servers.get_client())
    loader = trainer_loader(cfg, omega_conf_to_dataclass(cfg.actor_rollout_ref.model))
    adapter = BubbleSpecServerAdapter(config=cfg.actor_rollout_ref.rollout,
                                      model_config=cfg.actor_rollout_ref.model, device_mesh=None)
    digests = []
    for g, batch_dict in enumerate(loader, start=1):
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))],
                                                 dtype=object)
        batch.meta_info["global_steps"] = g
        out = manager.generate_sequences(batch.repeat(repeat_times=2, interleave=True))
        tokens = (out.batch["responses"] * out.batch["response_mask"]).tolist()
        digests.append(hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16])
        asyncio.run(adapter.update_weights(iter(trainer_weights()), global_steps=g))
    steps = [{"step": s["step"], "wall_s": round(s["wall_s"], 2),
              **{k: s["counters"][k] for k in KEYS}} for s in ray.get(server.steps.remote())]
    print(json.dumps({"pregen": pregen, "digests": digests, "steps": steps}))
    ray.get(server.shutdown.remote(), timeout=120)
    ray.shutdown()


if __name__ == "__main__":  # vLLM spawns processes: keep the guard
    main(sys.argv[1:] == ["on"])
