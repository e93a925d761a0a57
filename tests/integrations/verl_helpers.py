"""A verl 0.9 config and dataset for the plugin's tests: verl's own generated PPO config
(`verl/trainer/config/_generated_ppo_trainer.yaml`, what `main_ppo` composes by default)
with the rollout set to bubblespec and the embedded model, and a parquet dataset of the
embedded task's prompts in verl's RL format (the chat `prompt`, `data_source`,
`reward_model`, `extra_info.index`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# A chat template for the embedded model (it has none): the user's text after <bos>, which
# makes verl's prompt ids equal the task's own token ids.
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def write_dataset(path: Path, n: int, seed: int) -> list[Any]:
    """`n` embedded-task prompts as a verl RL parquet file; the task's Prompt objects."""
    import pandas as pd

    from bubblespec.tasks import default_task

    prompts = default_task().make_prompts(n, seed)
    rows = [{"data_source": "addchain", "prompt": [{"role": "user", "content": p.text}],
             "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
             "extra_info": {"index": i}} for i, p in enumerate(prompts)]
    pd.DataFrame(rows).to_parquet(path)
    return prompts


def verl_config(model: str, train_file: Path, batch_size: int, n: int,
                response_length: int = 256, **bubblespec: Any) -> Any:
    """verl's default PPO trainer config with the rollout set to bubblespec (GRPO, `n`
    samples), the embedded model and the dataset; `bubblespec` goes to
    `engine_kwargs.bubblespec`."""
    import verl
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__),
                                      "trainer/config/_generated_ppo_trainer.yaml"))
    cfg.algorithm.adv_estimator = "grpo"
    cfg.data.train_files = str(train_file)
    cfg.data.val_files = str(train_file)
    cfg.data.train_batch_size = batch_size
    cfg.data.seed = 7
    cfg.data.max_prompt_length = 64
    cfg.data.max_response_length = response_length
    cfg.data.dataloader_num_workers = 0
    m = cfg.actor_rollout_ref.model
    m.path = model
    m.custom_chat_template = CHAT_TEMPLATE
    r = cfg.actor_rollout_ref.rollout
    r.name = "bubblespec"
    r.n = n
    r.tensor_model_parallel_size = 1
    r.prompt_length = 64
    r.response_length = response_length
    r.calculate_log_probs = True
    r.agent.num_workers = 1
    r.agent.agent_loop_manager_class = (
        "bubblespec.integrations.verl.hook.BubbleSpecAgentLoopManager")
    r.engine_kwargs = {"bubblespec": dict(bubblespec)}
    return cfg


def trainer_loader(cfg: Any, model_config: Any) -> Any:
    """The train dataloader exactly as verl's `RayPPOTrainer._create_dataloader` builds it."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn

    ds = create_rl_dataset(cfg.data.train_files, cfg.data, model_config.tokenizer,
                           model_config.processor,
                           max_samples=cfg.data.get("train_max_samples", -1))
    return StatefulDataLoader(dataset=ds, batch_size=cfg.data.train_batch_size,
                              num_workers=cfg.data.dataloader_num_workers, drop_last=True,
                              collate_fn=collate_fn, sampler=create_rl_sampler(cfg.data, ds))


def trainer_weights() -> list[tuple[str, Any]]:
    """What an FSDP trainer's `get_per_tensor_param` yields for the embedded model: every
    tensor in HF naming, in bf16 (the usual training dtype), plus a tied `lm_head.weight`."""
    import torch
    from safetensors.torch import load_file

    from bubblespec.tasks import default_model_dir

    state = load_file(str(default_model_dir() / "model.safetensors"))
    pairs = [(k, v.to(torch.bfloat16)) for k, v in state.items()]
    emb = state.get("model.embed_tokens.weight")
    if emb is not None and "lm_head.weight" not in state:
        pairs.append(("lm_head.weight", emb.to(torch.bfloat16)))
    return pairs
