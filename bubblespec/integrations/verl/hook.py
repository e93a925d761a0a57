"""The next-batch hook: verl's agent-loop manager, announcing each step and its next batch.

`BubbleSpecAgentLoopManager` is verl's `AgentLoopManager` (set it with
`actor_rollout_ref.rollout.agent.agent_loop_manager_class`) with one addition: before its
workers send a batch's `generate` calls, it tells the server actor how many calls make the
step and the next training batch's prompt ids, which the ranks pre-generate in the step's
bubble (and, with `lookahead` > 1, the batches after it, which bubbles go on to once the
next one is covered). verl's trainer does not hand the rollout its next batch, so the hook
finds it
without touching the trainer's data order: `NextBatchPeeker` walks a twin of the trainer's
train dataloader, built as verl builds it (`create_rl_dataset`, `create_rl_sampler`, the
same batch size and `drop_last`; with the same seed the sampler draws the same order every
epoch). The twin's batch for global step g is checked against the batch the trainer really
sent (its prompts, in order); on a mismatch (a custom sampler or dataset that is not
deterministic) the hook logs it once and passes no next prompts, which costs speed only.
The twin holds a second copy of the train dataset in the trainer's driver process, and
reads each batch once more (in the driver, without worker processes).

The next prompts are tokenized as verl's agent loop tokenizes a prompt: its Continuous
Token builder (`build_initial_tokens` of the chat messages, cut to `rollout.prompt_length`
from the left), so their ids equal what the next step's `generate` calls will carry.
Validation batches announce their size with no next prompts.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import ray
from verl.experimental.agent_loop import AgentLoopManager
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.ray_utils import auto_await

from bubblespec.integrations.verl.settings import NAMESPACE, SERVER_NAME, BubbleSpecSettings

log = logging.getLogger("bubblespec.integrations.verl")


def _key(messages: Any) -> str:
    return json.dumps(list(messages), sort_keys=True, default=str)


def distinct_in_order(items: Any) -> list[Any]:
    """Each item once, in first-seen order (a batch repeated `n` times, interleaved)."""
    seen: dict[str, Any] = {}
    for m in items:
        seen.setdefault(_key(m), m)
    return list(seen.values())


class NextBatchPeeker:
    """A twin of the trainer's train dataloader, read `depth` batches ahead (module
    docstring)."""

    def __init__(self, config: Any, model_config: Any, depth: int = 1) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

        data = config.data
        self.dataset = create_rl_dataset(data.train_files, data, model_config.tokenizer,
                                         model_config.processor,
                                         max_samples=data.get("train_max_samples", -1))
        self._make_loader = lambda: StatefulDataLoader(
            dataset=self.dataset, batch_size=data.get("gen_batch_size") or data.train_batch_size,
            num_workers=0, drop_last=True, collate_fn=collate_fn,
            sampler=create_rl_sampler(data, self.dataset))
        self.loader = self._make_loader()
        self.prompt_length = int(config.actor_rollout_ref.rollout.prompt_length)
        model_type = getattr(model_config.hf_config, "model_type", None)
        self.builder = create_continuous_token_builder(
            model_config.tokenizer, hf_model_type=model_type if isinstance(model_type, str)
            else None, chat_template_kwargs=data.get("apply_chat_template_kwargs", {}),
            mm_processor_kwargs=data.get("mm_processor_kwargs", {}),
            processor=model_config.processor)
        self._it: Any = None
        self.depth = max(1, int(depth))
        self._pos = -1  # global index of the batch last read from the twin
        self._cache: dict[int, list[Any]] = {}
        self._warned = False

    def batch(self, index: int) -> list[Any]:
        """The chat messages of the trainer's batch number `index` (0-based, across epochs)."""
        if index in self._cache:
            return self._cache[index]
        if index < self._pos:  # went back (a resumed run): replay from the first epoch
            self.loader, self._it, self._pos = self._make_loader(), None, -1
        per_epoch = len(self.loader)
        while self._pos < index:
            if self._it is None or (self._pos + 1) % per_epoch == 0:
                self._it = iter(self.loader)
            self._pos += 1
            raw = list(next(self._it)["raw_prompt"])
            self._cache = {k: v for k, v in self._cache.items()
                           if k >= self._pos - self.depth}
            self._cache[self._pos] = raw
        return self._cache[index]

    def prompt_ids(self, messages: Any) -> list[int]:
        ids = self.builder.build_initial_tokens(list(messages))
        return list(ids[-self.prompt_length:])

    def next_prompts(self, global_steps: int | None, raw_prompts: Any
                     ) -> list[list[list[int]]] | None:
        """Prompt ids of the `depth` batches after the one of `global_steps` (1-based, as
        verl counts), nearest first, or None when the twin does not hold the trainer's batch
        there."""
        if global_steps is None or global_steps < 1 or raw_prompts is None:
            return None
        now = [_key(m) for m in distinct_in_order(raw_prompts)]
        mine = [_key(m) for m in distinct_in_order(self.batch(global_steps - 1))]
        if now[:len(mine)] != mine:
            if not self._warned:
                log.warning("step %d: the trainer's batch is not the twin dataloader's; no "
                            "next prompts are pre-generated (is the sampler seeded?)",
                            global_steps)
                self._warned = True
            return None
        out = [self._ids(self.batch(global_steps + j)) for j in range(self.depth)]
        return out if any(out) else None

    def _ids(self, batch: list[Any]) -> list[list[int]]:
        out = []
        for messages in distinct_in_order(batch):
            try:
                out.append(self.prompt_ids(messages))
            except Exception as e:  # noqa: BLE001 (a prompt the text-only builder cannot render)
                log.info("next prompt skipped: %s", e)
        return out


class BubbleSpecAgentLoopManager(AgentLoopManager):
    """verl's `AgentLoopManager` that announces each step to the bubblespec server."""

    def __init__(self, config: Any, llm_client: Any, teacher_client: Any = None,
                 reward_loop_worker_handles: Any = None) -> None:
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
        settings = BubbleSpecSettings.from_rollout_config(config.actor_rollout_ref.rollout)
        self.server = ray.get_actor(SERVER_NAME, namespace=NAMESPACE)
        self.peeker: NextBatchPeeker | None = None
        if settings.pregen:
            model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
            self.peeker = NextBatchPeeker(config, model, settings.lookahead)

    @auto_await
    async def generate_sequences(self, prompts: Any) -> Any:
        """Announce the batch (and the next one), then run verl's own agent loops."""
        nxt = None
        if self.peeker is not None and not prompts.meta_info.get("validate", False):
            nxt = self.peeker.next_prompts(prompts.meta_info.get("global_steps"),
                                           prompts.non_tensor_batch.get("raw_prompt"))
        await self.server.begin_step.remote(len(prompts), nxt)
        return await super().generate_sequences(prompts)
