"""What vLLM's token routes do on the gateway: token-in/token-out generation through the
shared step batcher (one ask per sample, so these requests share steps, hand prompts ahead
and get drafts like the others), and the tokenizer's two directions."""

from __future__ import annotations

import time
import uuid
from typing import Any

from bubblespec.batching import Answer, Ask
from bubblespec.gateway.chat_template import ChatTemplateError
from bubblespec.gateway.fronts import FrontServices, chat_logprobs, for_caller, position_entries
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import PromptIn, RolloutRequest
from bubblespec.protocol.limits import TopLogprobs
from bubblespec.protocol.limits import clamp_logprob as _lp
from bubblespec.protocol.tokens import (
    DetokenizeIn,
    GenerateLogProb,
    GenerateLogProbs,
    GenerateLogProbsContent,
    GenerateTokensIn,
    TokenizeIn,
)


def tokens_logprobs(ids: list[int], lps: list[float], top: TopLogprobs | None,
                    n: int) -> GenerateLogProbs:
    """vLLM's generate-shaped log-probs: per token its id and log-prob, and the first
    max(n, 1) entries of the engine's list (the sampled token first, then by rank)."""
    content = []
    for i, (t, lp) in enumerate(zip(ids, lps)):
        entries = position_entries(top, i, t, lp)
        content.append(GenerateLogProbsContent(
            token_id=t, logprob=_lp(lp),
            top_logprobs=[GenerateLogProb(token_id=int(a), logprob=_lp(x))
                          for a, x in entries[:max(n, 1)]]))
    return GenerateLogProbs(content=content)


def _field(internal: str) -> str:
    """A field of the internal rollout body as the generate request spells it."""
    if internal == "n":
        return "sampling_params.n"
    if internal.startswith("next_prompts"):
        return internal
    for old, new in (("prompts[0].input_ids", "token_ids"), ("prompts", "token_ids"),
                     ("sampling_params.max_new_tokens", "sampling_params.max_tokens")):
        if internal.startswith(old):
            return new + internal[len(old):]
    return internal


class TokensServing:
    """vLLM's token routes over the fronts' shared services."""

    def __init__(self, fronts: FrontServices) -> None:
        self.fronts = fronts

    async def generate(self, body: GenerateTokensIn) -> dict[str, Any]:
        """One prompt's `n` samples, answered in vLLM's `GenerateTokensResponse` (or
        `GenerateTextResponse`) shape; a stream is built from it by the route."""
        f = self.fronts
        sp = body.sampling_params
        prompt = list(body.token_ids)
        try:  # the vocabulary and the gateway's limits, as a rollout checks them
            f.rollouts.preparer.prepare(RolloutRequest(
                prompts=[PromptIn(input_ids=prompt)], n=sp.n,
                sampling_params=sp.to_sampling(max(1, sp.min_tokens)),
                next_prompts=[PromptIn(input_ids=p) for p in body.next_prompts]
                if body.next_prompts else None))
        except ApiError as e:
            raise for_caller(e, _field(e.field)) from None
        (budget,) = await f.budgets(sp.max_tokens, [prompt], "sampling_params.max_tokens",
                                    lambda i: "token_ids")
        if sp.min_tokens > budget:
            raise ApiError(400, f"min_tokens ({sp.min_tokens}) must be at most the response "
                                f"budget ({budget})", "sampling_params.min_tokens")
        sampling = sp.to_sampling(budget)
        f.check_quarantine([prompt], sampling, lambda i: "token_ids")
        await f.check_constraint(sampling, "sampling_params.structured_outputs",
                                 "sampling_params.bad_words")
        if body.next_prompts:
            f.batcher.add_next([list(p) for p in body.next_prompts])
        rid = body.request_id or uuid.uuid4().hex
        top = sp.logprobs or 0
        asks = [Ask(prompt, sampling, None if sp.seed is None else sp.seed + k, f"{rid}-{k}",
                    top_logprobs=top) for k in range(sp.n)]
        answers = await f.batcher.generate(asks)
        text_mode = body.output_mode == "text"
        choices = [self._choice(k, body, ans, text_mode) for k, ans in enumerate(answers)]
        completion = sum(len(c["token_ids"]) for c in choices)
        out: dict[str, Any] = {
            "request_id": f"generate-tokens-{rid}", "model": body.model or await f.model_id(),
            "created": int(time.time()), "output_mode": body.output_mode, "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                      "total_tokens": len(prompt) + completion},
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if body.return_token_ids else None}
        return out

    def _choice(self, index: int, body: GenerateTokensIn, ans: Answer,
                text_mode: bool) -> dict[str, Any]:
        sp = body.sampling_params
        s = ans.sample
        ids = [] if s is None else list(s.output_ids)
        lps = [] if s is None else list(s.output_logprobs or [])
        reason = "abort" if s is None else s.finish_reason or "stop"
        reason = reason if reason in ("stop", "length") else "abort"
        stop_reason = ids[-1] if (reason == "stop" and ids
                                  and ids[-1] in (sp.stop_token_ids or ())) else None
        choice: dict[str, Any] = {"index": index, "finish_reason": reason,
                                  "stop_reason": stop_reason, "token_ids": ids}
        top = None if s is None else s.output_top_logprobs
        if sp.logprobs is not None:
            choice["logprobs"] = (chat_logprobs(self.fronts, ids, lps, top,
                                                max(sp.logprobs, 1)).model_dump()
                                  if text_mode else
                                  tokens_logprobs(ids, lps, top, sp.logprobs).model_dump())
        else:
            choice["logprobs"] = None
        if text_mode:
            text_ids = ids[:-1] if reason == "stop" and ids else ids  # the stop token's text
            # is not returned (vLLM)
            choice["text"] = self.fronts.decode(text_ids, sp.skip_special_tokens)
        if s is not None:
            choice["bubblespec"] = {"step": ans.step, "weight_version": s.weight_version,
                                    "decode_steps": s.decode_steps,
                                    "num_accepted_tokens": s.num_accepted_tokens,
                                    "num_accepted_pregen_tokens": s.num_accepted_pregen_tokens}
        return choice

    async def tokenize(self, body: TokenizeIn) -> dict[str, Any]:
        """vLLM's `TokenizeResponse`: the ids (of the prompt, or of the rendered chat), their
        count, the served context length and, if asked, each token's text."""
        f = self.fronts
        if body.messages is not None:
            template = f.chat_template()
            if template is None:
                raise ApiError(400, "the model has no chat template", "messages")
            try:
                text = template.render(body.messages, body.add_generation_prompt,
                                       body.chat_template_kwargs)
            except ChatTemplateError as e:
                raise ApiError(400, str(e), "messages") from None
            ids = f.encode(text, "messages", add_special_tokens=bool(body.add_special_tokens))
        elif body.prompt is None:
            raise ApiError(400, "give either prompt or messages", "prompt")
        else:
            ids = f.encode(body.prompt, "prompt",
                           add_special_tokens=body.add_special_tokens is not False)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": await f.context_len() or 0,
                               "tokens": ids, "token_strs": None}
        if body.return_token_strs:
            out["token_strs"] = [f.decode([t], False) for t in ids]
        return out

    async def detokenize(self, body: DetokenizeIn) -> dict[str, Any]:
        """vLLM's `DetokenizeResponse`: the text of the ids (special tokens kept, as vLLM's
        /detokenize decodes them)."""
        vocab = self.fronts.rollouts.preparer.tokenizer.vocab_size
        for i, t in enumerate(body.tokens):
            if t >= vocab:
                raise ApiError(400, f"token id {t} is outside the vocabulary [0, {vocab})",
                               f"tokens[{i}]")
        return {"prompt": self.fronts.decode(body.tokens, False)}
