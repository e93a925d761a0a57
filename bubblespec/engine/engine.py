"""Async rollout engine: vLLM `AsyncLLM` with bubblespec drafts, token-in/token-out.

One engine per rank. `generate` runs a batch (each request expanded to `n` seeded
sub-requests so that every sample has its own seed and sample index), returns output ids,
the target model's log-probs of the emitted tokens, finish reasons and per-request
counters, and can be stopped early by a caller hook polled every `poll_every` decode steps
(partial outputs are returned). `update_weights` reloads safetensors in place and bumps
the weight version that every output is tagged with.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bubblespec.engine import vllm_glue
from bubblespec.engine.config import EngineConfig
from bubblespec.engine.sampling import vllm_sampling
from bubblespec.engine.types import GenRequest, GenResult, SampleResult, SpecMode
from bubblespec.engine.validate import validate_request
from bubblespec.protocol.errors import InvalidRequest
from bubblespec.protocol.keys import group_token, make_request_id

log = logging.getLogger(__name__)

StopHook = Callable[[], Awaitable[bool]]


def default_model_dir() -> str:
    from bubblespec.tasks import default_model_dir as d

    return str(d())


@dataclass
class _Sub:
    req_index: int
    sample_index: int
    rid: str
    ids: list[int]
    logprobs: list[float]
    finish: str = "running"
    steps_seen: int = 0


class RolloutEngine:
    """One vLLM engine plus bubblespec's proposer. Create with `await RolloutEngine.start()`."""

    def __init__(self, cfg: EngineConfig, llm: Any, vocab_size: int, max_model_len: int) -> None:
        self.cfg = cfg
        self.llm = llm
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.weight_version = 0
        self.tokens_generated = 0
        """Output tokens of every request so far (a progress counter for time splits)."""
        self._gen_count = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._weights_lock = asyncio.Lock()

    @classmethod
    async def start(cls, cfg: EngineConfig) -> RolloutEngine:
        """Start vLLM (about 15 s on CPU with eager mode) and configure the proposer."""
        vllm_glue.check_vllm_version()
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_gib))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        model = cfg.model or default_model_dir()
        spec = None
        if cfg.spec_mode != SpecMode.NONE:
            spec = {"method": "custom_class",
                    "model": "bubblespec.engine.proposer.BubbleSpecProposer",
                    "num_speculative_tokens": cfg.num_speculative_tokens}
        args = AsyncEngineArgs(
            model=model, skip_tokenizer_init=True, enforce_eager=cfg.enforce_eager,
            max_model_len=cfg.max_model_len or None, dtype=cfg.dtype, seed=cfg.seed,
            max_num_seqs=cfg.max_num_seqs, speculative_config=spec,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            worker_extension_cls="bubblespec.engine.vllm_glue.WorkerExtension",
            enable_prefix_caching=True)
        t0 = time.monotonic()
        llm = AsyncLLM.from_engine_args(args)
        vocab = int(llm.model_config.get_vocab_size())
        eng = cls(cfg, llm, vocab, int(llm.model_config.max_model_len))
        await llm.collective_rpc("bubblespec_install_keyed")
        if spec is not None:
            await llm.collective_rpc("bubblespec_configure", args=(eng.proposer_options(),))
        log.info("engine started in %.1f s (model %s, spec %s)", time.monotonic() - t0,
                 model, cfg.spec_mode.value)
        return eng

    def proposer_options(self) -> dict:
        """What `bubblespec_configure` passes to the proposer (from the engine config)."""
        c = self.cfg
        return {"mode": c.spec_mode.value,
                "sources": {"pregen": c.src_pregen, "siblings": c.src_siblings,
                            "self_context": c.src_self, "history": c.src_history,
                            "global_pool": c.src_global},
                "draft": {"max_spec_tokens": c.num_speculative_tokens,
                          "max_spec_factor": c.max_spec_factor,
                          "max_spec_offset": c.max_spec_offset,
                          "min_token_prob": c.min_token_prob},
                "token_budget": c.index_token_budget,
                "global_token_budget": c.global_token_budget,
                "fault_biased_verifier": c.fault_biased_verifier}

    async def set_sources(self, pregen: bool, siblings: bool, self_context: bool,
                          history: bool = False, global_pool: bool | None = None) -> None:
        """Switch draft sources between batches (resets the draft index; `global_pool`
        None keeps the configured one)."""
        upd = {"src_pregen": pregen, "src_siblings": siblings, "src_self": self_context,
               "src_history": history}
        if global_pool is not None:
            upd["src_global"] = global_pool
        self.cfg = self.cfg.model_copy(update=upd)
        if self.speculative:
            await self.llm.collective_rpc("bubblespec_configure",
                                          args=(self.proposer_options(),))

    @property
    def speculative(self) -> bool:
        return self.cfg.spec_mode != SpecMode.NONE

    # ------------------------------------------------------------------ drafts
    async def add_drafts(self, items: list[tuple[str, int, list[int]]]) -> int:
        """Push pre-generated responses (group key, sample index, token ids) into the index."""
        if self.cfg.spec_mode != SpecMode.BUBBLESPEC or not items:
            return 0
        payload = [(group_token(g), int(s), [int(t) for t in ids]) for g, s, ids in items]
        res = await self.llm.collective_rpc("bubblespec_add_drafts", args=(payload,))
        return int(res[0])

    async def release_groups(self, groups: list[str]) -> None:
        """Forget the drafts and outputs of these prompt groups (end of a step)."""
        if self.speculative and groups:
            await self.llm.collective_rpc("bubblespec_release",
                                          args=([group_token(g) for g in groups],))

    async def index_stats(self) -> dict[str, int]:
        """The proposer's draft-index fill level (empty without speculation)."""
        if not self.speculative:
            return {}
        return dict((await self.llm.collective_rpc("bubblespec_index_stats"))[0])

    # ------------------------------------------------------------------ weights
    async def update_weights(self, path: str, version: int | None = None) -> int:
        """Reload weights from a safetensors directory between batches; returns the version."""
        if not os.path.isdir(path):
            raise InvalidRequest("path", f"not a directory: {path}")
        async with self._weights_lock:
            await self._idle.wait()
            await vllm_glue.reload_weights(self.llm, path)
            await self.llm.reset_prefix_cache()
            self.weight_version = self.weight_version + 1 if version is None else int(version)
        return self.weight_version

    # ------------------------------------------------------------------ generate
    def validate(self, req: GenRequest) -> None:
        validate_request(req, self.vocab_size, self.max_model_len)

    async def generate(self, requests: list[GenRequest], should_stop: StopHook | None = None,
                       poll_every: int = 8, counters: bool = True) -> list[GenResult]:
        """Run a batch; with `should_stop`, poll it every `poll_every` decode steps and abort
        the unfinished samples when it says so (their partial outputs are returned).
        `counters=False` skips fetching the per-request draft counters (one engine RPC per
        call; pre-generation runs each task as its own call and does not use them)."""
        for req in requests:
            self.validate(req)
        async with self._weights_lock:
            self._gen_count += 1
            self._idle.clear()
        try:
            return await self._generate(requests, should_stop, poll_every, counters)
        finally:
            self._gen_count -= 1
            if self._gen_count == 0:
                self._idle.set()

    async def _generate(self, requests: list[GenRequest], should_stop: StopHook | None,
                        poll_every: int, counters: bool = True) -> list[GenResult]:
        from vllm.inputs import TokensPrompt

        version = self.weight_version
        subs: list[_Sub] = []
        tasks = []
        progress = asyncio.Event()

        async def run(sub: _Sub, prompt: Any, sp: Any) -> None:
            async for out in self.llm.generate(prompt, sp, request_id=sub.rid):
                comp = out.outputs[0]
                sub.ids.extend(comp.token_ids)
                self.tokens_generated += len(comp.token_ids)
                if comp.logprobs:
                    sub.logprobs.extend(next(iter(lp.values())).logprob if len(lp) == 1
                                        else lp[t].logprob
                                        for t, lp in zip(comp.token_ids, comp.logprobs))
                sub.steps_seen += 1
                progress.set()
                if out.finished:
                    sub.finish = comp.finish_reason or "stop"

        for ri, req in enumerate(requests):
            s = req.sampling
            prompt = TokensPrompt(prompt_token_ids=list(req.input_ids))
            uid = uuid.uuid4().hex[:12]
            for j in range(req.n):
                sample_index = req.sample_offset + j
                seed = req.seeds[j] if req.seeds else None
                sp = vllm_sampling(s, seed)
                sub = _Sub(ri, sample_index, make_request_id(req.group_key(), sample_index,
                                                             f"{uid}{j}"), [], [])
                subs.append(sub)
                tasks.append(asyncio.create_task(run(sub, prompt, sp)))
        stopped = False
        if should_stop is not None:
            stopped = await self._watch(subs, tasks, progress, should_stop, poll_every)
        await asyncio.gather(*tasks, return_exceptions=stopped)
        if stopped:
            for sub in subs:
                if sub.finish == "running":
                    sub.finish = "abort"
        return await self._collect(requests, subs, version, counters)

    async def _watch(self, subs: list[_Sub], tasks: list, progress: asyncio.Event,
                     should_stop: StopHook, poll_every: int) -> bool:
        """Poll `should_stop` every `poll_every` engine steps; abort all on True."""
        next_poll = poll_every
        while not all(t.done() for t in tasks):
            progress.clear()
            steps = max((s.steps_seen for s in subs), default=0)
            if steps >= next_poll:
                next_poll = steps + poll_every
                if await should_stop():
                    await self.llm.abort([s.rid for s in subs if s.finish == "running"])
                    for t in tasks:
                        if not t.done():
                            t.cancel()
                    return True
            waiter = asyncio.create_task(progress.wait())
            await asyncio.wait([waiter, *[t for t in tasks if not t.done()]],
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        return False

    async def _collect(self, requests: list[GenRequest], subs: list[_Sub],
                       version: int, counters: bool = True) -> list[GenResult]:
        stats: dict[str, tuple] = {}
        if self.speculative and counters:
            res = await self.llm.collective_rpc("bubblespec_pop_stats",
                                                args=([s.rid for s in subs],))
            stats = res[0]
        results = [GenResult(r.group_key(), []) for r in requests]
        for sub in subs:
            n_out = len(sub.ids)
            steps, drafts, dtoks, _acc, acc_pregen = stats.get(sub.rid, (n_out, 0, 0, 0, 0))
            results[sub.req_index].samples.append(SampleResult(
                output_ids=sub.ids, output_logprobs=sub.logprobs[:n_out],
                finish_reason=sub.finish, sample_index=sub.sample_index,
                weight_version=version, decode_steps=steps, num_drafts=drafts,
                num_draft_tokens=dtoks, num_accepted_tokens=max(0, n_out - steps),
                num_accepted_pregen_tokens=min(acc_pregen, max(0, n_out - steps))))
        return results

    async def shutdown(self) -> None:
        """Stop the engine processes (idempotent)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            vllm_glue.shutdown(llm)
