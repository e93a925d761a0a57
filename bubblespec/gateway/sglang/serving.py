"""What SGLang's /generate does on the gateway: samples through the shared step batcher,
prompts scored with `max_new_tokens: 0`, and each sample in SGLang's answer shape."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from bubblespec.batching import Answer, Ask
from bubblespec.gateway.fronts import FrontServices
from bubblespec.gateway.scoring import rank_field_batched
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.sglang import FinishReason, GenerateIn, SglMetaInfo, SglSampleMeta


class SglangServing:
    """SGLang's /generate over the fronts' shared services."""

    def __init__(self, fronts: FrontServices) -> None:
        self.fronts = fronts

    def out(self, body: GenerateIn, ask: Ask, ans: Answer, t0: float) -> dict[str, Any]:
        """One SGLang answer of one sample."""
        f = self.fronts
        sp = body.sampling_params
        s = ans.sample
        ids = [] if s is None else list(s.output_ids)
        reason = "abort" if s is None else s.finish_reason or "stop"
        finish: dict[str, Any] = {"type": reason if reason in ("stop", "length") else "abort"}
        text_ids = ids
        if finish["type"] == "stop" and ids:
            finish["matched"] = ids[-1]
            if not sp.no_stop_trim:
                text_ids = ids[:-1]
        elif finish["type"] == "length":
            finish["length"] = len(ids)
        else:
            finish["message"] = ans.message or "aborted"
        meta = SglMetaInfo(
            id=ask.rid, finish_reason=FinishReason(**finish), prompt_tokens=len(ans.input_ids),
            completion_tokens=len(ids), cached_tokens=0,
            weight_version=str(0 if s is None else s.weight_version),
            e2e_latency=time.monotonic() - t0)
        if body.return_logprob:
            lps = (s.output_logprobs or []) if s is not None else []
            meta.output_token_logprobs = [
                (lp, t, f.decode([t], False) if body.return_text_in_logprobs else None)
                for lp, t in zip(lps, ids)]
            if body.top_logprobs_num and s is not None and s.output_top_logprobs is not None:
                meta.output_top_logprobs = [
                    [(lp, t, f.decode([t], False) if body.return_text_in_logprobs else None)
                     for t, lp in sorted(pos, key=lambda e: -e[1])[:body.top_logprobs_num]]
                    for pos in s.output_top_logprobs]
        if s is not None:
            meta.bubblespec = SglSampleMeta(step=ans.step, **dict(s.meta))
        return {"text": f.decode(text_ids, sp.skip_special_tokens), "output_ids": ids,
                "meta_info": meta.model_dump(mode="json", exclude_unset=True)}

    def _where(self, body: GenerateIn, name: str = "input_ids") -> Callable[[int], str]:
        """How the caller's field of prompt i is spelled (`input_ids[i]`, or `input_ids`
        for a single prompt)."""
        return lambda i: f"{name}[{i}]" if body.batched else name

    async def generate(self, body: GenerateIn) -> Any:
        f = self.fronts
        t0 = time.monotonic()
        if body.next_input_ids:
            f.batcher.add_next(body.next_input_ids)
        sp = body.sampling_params
        if sp.n > f.config.max_n:
            raise ApiError(400, f"at most {f.config.max_n} samples per prompt",
                           "sampling_params.n")
        if sp.max_new_tokens == 0:
            return await self.score(body, t0)
        sampling = sp.to_sampling()
        top = (body.top_logprobs_num or 0) if body.return_logprob else 0
        f.check_quarantine(body.prompts(), sampling, self._where(body))
        await f.check_constraint(sampling, "sampling_params")
        asks = []
        for prompt, rid in zip(body.prompts(), body.rids()):
            base = rid or uuid.uuid4().hex
            for k in range(sp.n):
                seed = None if sp.sampling_seed is None else sp.sampling_seed + k
                asks.append(Ask(prompt, sampling, seed, base if sp.n == 1 else f"{base}-{k}",
                                top_logprobs=top))
        answers = await f.batcher.generate(asks)
        outs = [self.out(body, a, ans, t0) for a, ans in zip(asks, answers)]
        return outs if body.batched or sp.n > 1 else outs[0]

    async def score(self, body: GenerateIn, t0: float) -> Any:
        """`max_new_tokens: 0`: nothing is generated (`output_ids` [], finish reason length 0,
        as SGLang answers). With `return_logprob` and `logprob_start_len` >= 0 the prompts
        are scored on a rank (`scoring.py`: no rollout step) and `input_token_logprobs`
        holds [log-prob, token id, text or null] of each prompt token from that position on
        (the first prompt token's log-prob null), as slime's distillation teacher reads
        them; raw log-probs, before any temperature. Otherwise no rank is called. `n`
        copies per prompt, as SGLang answers n samples of zero tokens."""
        f = self.fronts
        sp = body.sampling_params
        prompts = f.token_ids(body.prompts(), self._where(body, "text"))
        start = body.logprob_start_len
        wanted = body.return_logprob and start is not None and start >= 0
        scored = None
        if wanted:
            assert start is not None
            for i, p in enumerate(prompts):
                if start >= len(p):
                    which = f"input_ids[{i}]" if body.batched else "the prompt"
                    raise ApiError(400, f"logprob_start_len: {start} is not below the length "
                                        f"of {which} ({len(p)} tokens)", "logprob_start_len")
            scored = await f.scorer.score(prompts, rank_field_batched(body.batched))
            version = scored.weight_version
        else:
            version = await f.weight_version()
        outs = []
        for i, (p, rid) in enumerate(zip(prompts, body.rids())):
            base = rid or uuid.uuid4().hex
            for k in range(sp.n):
                meta = SglMetaInfo(
                    id=base if sp.n == 1 else f"{base}-{k}",
                    finish_reason=FinishReason(type="length", length=0),
                    prompt_tokens=len(p), completion_tokens=0, cached_tokens=0,
                    weight_version=str(version), e2e_latency=time.monotonic() - t0)
                if body.return_logprob:
                    meta.output_token_logprobs = []
                if scored is not None and start is not None:
                    meta.input_token_logprobs = [
                        (lp, t, f.decode([t], False) if body.return_text_in_logprobs
                         else None)
                        for lp, t in zip(scored.logprobs[i][start:], p[start:])]
                outs.append({"text": "", "output_ids": [],
                             "meta_info": meta.model_dump(mode="json", exclude_unset=True)})
        return outs if body.batched or sp.n > 1 else outs[0]
