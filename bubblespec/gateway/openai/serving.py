"""What the OpenAI routes do: completions and chat completions sampled through the shared step
batcher (one ask per choice), stop strings cut after sampling, and the prompts' scores for `echo` and `prompt_logprobs`."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from pydantic import ValidationError

from bubblespec.batching import Answer, Ask
from bubblespec.gateway.chat_template import ChatTemplateError
from bubblespec.gateway.fronts import FrontServices, for_caller
from bubblespec.gateway.openai.answers import (
    chat_choice,
    completion_choice,
    vllm_prompt_logprobs,
)
from bubblespec.gateway.openai.choice import Choice, Names, Sampled
from bubblespec.gateway.openai.tools import check_tools, tool_answers
from bubblespec.gateway.scoring import Scored
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import PromptIn, RolloutRequest
from bubblespec.protocol.openai import (
    ChatCompletionIn,
    ChatCompletionOut,
    CompletionIn,
    CompletionOut,
    SamplingFields,
)
from bubblespec.protocol.sampling import SamplingParams

log = logging.getLogger("bubblespec.gateway.openai")


def _prompt_in(p: list[int] | str) -> PromptIn:
    return PromptIn(text=p) if isinstance(p, str) else PromptIn(input_ids=p)


class OpenAiServing:
    """The OpenAI routes' logic over the fronts' shared services (one step batcher, so that
    OpenAI and SGLang requests share steps)."""

    def __init__(self, fronts: FrontServices) -> None:
        self.fronts = fronts

    # ------------------------------------------------------------------ sampling
    async def _truncated(self, prompts: list[list[int] | str], body: SamplingFields,
                         names: Names) -> list[list[int] | str]:
        """The prompts as token ids, text tokenized with or without BOS
        (`add_special_tokens`), cut to `truncate_prompt_tokens` (-1: the context length)
        from `truncation_side` (left: the last tokens are kept), as vLLM does."""
        f = self.fronts

        def where(i: int) -> str:
            return names.of(f"prompts[{i}]") if names.batched else names.prompt

        out: list[list[int] | str] = [
            f.encode(p, where(i), add_special_tokens=body.add_special_tokens is not False)
            if isinstance(p, str) else list(p) for i, p in enumerate(prompts)]
        keep = body.truncate_prompt_tokens
        if keep is None:
            return out
        if keep == -1:
            keep = await f.context_len() or max(len(p) for p in out)
        if keep == 0:
            raise ApiError(400, "truncate_prompt_tokens 0 leaves an empty prompt",
                           "truncate_prompt_tokens")
        right = body.truncation_side == "right"
        return [p[:keep] if right else p[-keep:] for p in out]

    async def sample(self, prompts: list[list[int] | str], body: SamplingFields,
                     budget: int | None, names: Names) -> Sampled:
        """Check and tokenize the prompts, queue one ask per choice, wait for the step(s),
        and cut each choice at its stop string."""
        f = self.fronts
        rollouts = f.rollouts
        if body.add_special_tokens is False or body.truncate_prompt_tokens is not None:
            prompts = await self._truncated(prompts, body, names)
        try:
            probe = RolloutRequest(
                prompts=[_prompt_in(p) for p in prompts], n=body.n,
                sampling_params=body.to_sampling(max(1, body.min_tokens)),
                next_prompts=[_prompt_in(p) for p in body.next_prompts]
                if body.next_prompts else None)
        except ValidationError as e:
            raise ApiError(400, str(e.errors()[0].get("msg")), names.prompt) from None
        try:
            prep = rollouts.preparer.prepare(probe)  # limits and vocabulary, text tokenized
        except ApiError as e:
            raise for_caller(e, names.of(e.field)) from None
        budgets = await f.budgets(
            budget, prep.prompts, names.budget,
            lambda i: names.of(f"prompts[{i}]") if names.batched else names.prompt)
        if body.min_tokens > min(budgets):
            raise ApiError(400, f"min_tokens ({body.min_tokens}) must be at most the response "
                                f"budget ({min(budgets)})", "min_tokens")
        samplings = {b: body.to_sampling(b) for b in set(budgets)}
        for b, sampling in samplings.items():
            mine = [i for i, x in enumerate(budgets) if x == b]
            f.check_quarantine([prep.prompts[i] for i in mine], sampling,
                               lambda j, mine=mine: names.of(f"prompts[{mine[j]}]")
                               if names.batched else names.prompt)
        await f.check_constraint(next(iter(samplings.values())), body.structured_field)
        for j, batch in enumerate(prep.next_batches):
            f.batcher.add_next(batch, ahead=j)
        rid = uuid.uuid4().hex
        asks = [Ask(ids, samplings[budgets[i]], None if body.seed is None else body.seed + k,
                    f"{rid}-{i * body.n + k}", top_logprobs=body.num_top_logprobs)
                for i, ids in enumerate(prep.prompts) for k in range(body.n)]
        try:
            answers = await f.batcher.generate(asks)
        except ApiError as e:
            raise for_caller(e, names.of(e.field)) from None
        except Exception as e:
            log.exception("OpenAI request failed")
            raise ApiError(502, f"rollout failed: {type(e).__name__}: {e}") from e
        out = Sampled(prompts=prep.prompts)
        for j, (ask, ans) in enumerate(zip(asks, answers)):
            out.choices.append(self.choice(j, body, ask.sampling, ask, ans))
        return out

    def choice(self, index: int, body: SamplingFields, sampling: SamplingParams, ask: Ask,
               ans: Answer) -> Choice:
        """One answer as a choice: its text without the stop token, cut at a stop string."""
        s = ans.sample
        ids = [] if s is None else list(s.output_ids)
        lps = [] if s is None else list(s.output_logprobs or [])
        top = None if s is None else s.output_top_logprobs
        reason = "abort" if s is None else s.finish_reason or "stop"
        reason = reason if reason in ("stop", "length") else "abort"
        stop_reason: int | str | None = None
        text_ids = ids
        if reason == "stop" and ids:
            if ids[-1] in sampling.stop_token_ids:
                stop_reason = ids[-1]
            text_ids = ids[:-1]  # the stop token's text is not returned (vLLM)
        prompt_ids = list(ans.input_ids) or (list(ask.prompt)
                                             if not isinstance(ask.prompt, str) else [])
        meta: dict[str, Any] = {"step": ans.step}
        if s is not None:
            meta.update(weight_version=s.weight_version, decode_steps=s.decode_steps,
                        num_accepted_tokens=s.num_accepted_tokens,
                        num_accepted_pregen_tokens=s.num_accepted_pregen_tokens)
        cut = self.cut_at_stop(text_ids, body.stops(), body.skip_special_tokens,
                               body.include_stop_str_in_output)
        if cut is not None:
            last, text, stop = cut
            return Choice(index, prompt_ids, ids[:last + 1], lps[:last + 1], text, "stop", stop,
                          ans.step, meta, None if top is None else top[:last + 1],
                          text_ids[:last + 1])
        return Choice(index, prompt_ids, ids, lps,
                      self.fronts.decode(text_ids, body.skip_special_tokens), reason,
                      stop_reason, ans.step, meta, top, text_ids)

    def cut_at_stop(self, ids: list[int], stops: list[str], skip_special_tokens: bool,
                    include: bool) -> tuple[int, str, str] | None:
        """(index of the token that completed the first stop string, the text up to that
        string (through it when `include`), the string); None when no stop string occurs.

        The text is decoded token by token, as vLLM's detokenizer sees it, from the first
        token on; this is only done when the whole text holds a stop string."""
        decode = self.fronts.decode
        if not stops or not ids:
            return None
        if not any(s in decode(ids, skip_special_tokens) for s in stops):
            return None
        for last in range(len(ids)):
            text = decode(ids[:last + 1], skip_special_tokens)
            hits = [(text.find(s), s) for s in stops if s in text]
            if hits:
                pos, stop = min(hits)
                return last, text[:pos + (len(stop) if include else 0)], stop
        return None

    # ------------------------------------------------------------------ the routes' work
    async def completions(self, body: CompletionIn) -> CompletionOut:
        """Sample the choices (or, with `echo` and `max_tokens: 0`, generate nothing), and
        score the prompts when the answer carries their log-probs (`echo` with `logprobs`,
        or `prompt_logprobs`)."""
        f = self.fronts
        prompts = body.prompts()
        names = Names("prompt", "max_tokens", batched=len(prompts) > 1 or (
            isinstance(body.prompt, list) and bool(body.prompt)
            and not isinstance(body.prompt[0], int)))
        if body.max_tokens == 0:
            if not body.echo:
                raise ApiError(400, "max_tokens 0 is served with echo (prompt scoring)",
                               "max_tokens")
            ids = f.token_ids(prompts, lambda i: names.of(f"prompts[{i}]"))
            got = Sampled(prompts=ids, choices=[
                Choice(i * body.n + k, pids, [], [], "", "length", meta={"step": None})
                for i, pids in enumerate(ids) for k in range(body.n)])
        else:
            got = await self.sample(prompts, body, body.max_tokens, names)
        scored = None
        if body.prompt_top is not None:
            scored = await self.score_prompts(got.prompts, body.prompt_top, names)
        if body.max_tokens == 0:
            version = (scored.weight_version if scored is not None
                       else await f.weight_version())
            for ch in got.choices:
                ch.meta["weight_version"] = version
        texts = [p if isinstance(p, str) else f.decode(ids, body.skip_special_tokens)
                 for p, ids in zip(prompts, got.prompts)] if body.echo else None
        choices = []
        for ch in got.choices:
            i = ch.index // body.n
            echo = None if texts is None else ("" if body.return_token_ids else texts[i])
            choices.append(completion_choice(
                f, body, ch, echo, None if scored is None else scored.prompt(i)))
        return CompletionOut(
            id=f"cmpl-{body.request_id or uuid.uuid4().hex}", created=int(time.time()),
            model=body.model or await f.model_id(), choices=choices, usage=got.usage())

    async def score_prompts(self, ids: list[list[int]], top: int, names: Names) -> Scored:
        """The prompts' log-probs with `top` alternatives each, scored on a rank without a
        rollout step (`scoring.py`)."""
        def field_of(rank_field: str) -> str:  # input_ids[i][j] -> prompt[i][j] / prompt[j]
            m = re.match(r"input_ids(\[\d+\])(.*)", rank_field)
            return (names.of(f"prompts{m.group(1)}.input_ids{m.group(2)}") if m
                    else names.prompt)
        return await self.fronts.scorer.score(ids, field_of, top=top)

    async def chat_completions(self, body: ChatCompletionIn) -> ChatCompletionOut:
        f = self.fronts
        check_tools(f, body)
        template = f.chat_template()
        if template is None:
            raise ApiError(400, "the model has no chat template (its tokenizer_config.json "
                                "has no chat_template): use /v1/completions", "messages")
        try:
            text = template.render([m.template_dict() for m in body.messages],
                                   body.add_generation_prompt, body.template_kwargs(),
                                   continue_final=body.continue_final_message)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), "messages") from None
        ids = f.encode(text, "messages", add_special_tokens=bool(body.add_special_tokens))
        if not ids:
            raise ApiError(400, "the rendered conversation is empty", "messages")
        got = await self.sample([ids], body, body.budget,
                                Names("messages", body.max_tokens_field))
        tools = await tool_answers(f, body, got.choices)
        if body.echo:  # vLLM: the last message's text before each choice's, if it is the
            last = body.messages[-1].template_dict()  # answer's role (a turn continued)
            head = (last.get("content") or "") if last.get("role") == "assistant" else ""
            for t in tools:
                t.content = head + (t.content or "")
        scored = None
        if body.prompt_top is not None:
            scored = (await self.score_prompts(got.prompts, body.prompt_top,
                                               Names("messages", body.max_tokens_field)))
        return ChatCompletionOut(
            id=f"chatcmpl-{body.request_id or uuid.uuid4().hex}", created=int(time.time()),
            model=body.model or await f.model_id(),
            choices=[chat_choice(f, body, ch, t) for ch, t in zip(got.choices, tools)],
            usage=got.usage(), prompt_text=text if body.return_prompt_text else None,
            prompt_logprobs=None if scored is None else vllm_prompt_logprobs(
                f, got.prompts[0], scored.prompt(0)),
            prompt_token_ids=got.prompts[0] if body.return_token_ids else None)
