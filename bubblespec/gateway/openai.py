"""OpenAI's completion API on the gateway, so that agentic RL frameworks switch by address.

SkyRL, ART, rLLM and prime-rl drive vLLM through `POST /v1/completions` and
`POST /v1/chat/completions` and read token ids and log-probs back; these routes answer them
in OpenAI's shapes with vLLM's extensions (bodies in `bubblespec.protocol.openai`):

- POST /v1/completions  `prompt` as text, token ids, or a list of either; `n` choices per
  prompt, indexed prompt-major (choice `i * n + k` is sample k of prompt i); `echo` with
  `max_tokens: 0` scores the prompts instead (`scored_completion`, `scoring.py`: no step);
- POST /v1/chat/completions  `messages` rendered with the model's chat template
  (`chat_template.py`; a model without one is a 400 naming `messages`), then sampled as
  token ids;
- GET /v1/models  the one model the ranks serve.

Each choice is one `Ask` in the SGLang API's step batcher (`front.batcher`, the same
instance), so concurrent OpenAI and SGLang requests are batched into the same rollout
steps, and the next-prompts hint (`next_prompts` in a body, or POST /v1/next_prompts) goes
with the next step that starts. `seed` gives choice k of each prompt the seed `seed + k`,
as the SGLang API does; without it the gateway derives seeds from its run seed (and a step
that mixes seeded and unseeded samples uses derived seeds for all: `Step.seeds`).

Stop strings (`stop`) are applied after sampling: a choice is sampled with the stop token
ids as given, then its text is decoded token by token and cut at the first stop string;
the token ids and log-probs returned are those up to and including the token that
completed the stop string, with finish_reason "stop" and `stop_reason` the string. This is
what vLLM returns (it checks the same decoded text after each token and stops there), and
it does not change the distribution of what is returned: the tokens before the cut were
sampled exactly as they would have been by a sampler that stopped there, and none after it
is returned (a string stop only costs the compute of the tokens sampled past it).

finish_reason: "stop" (a stop token, EOS or a stop string), "length", or "abort" (the
request was aborted, as vLLM reports it). Each choice also carries `bubblespec`: the step
that ran it, the weight version that sampled it and its speculation counters (clients
ignore unknown keys; an RL framework can read the policy version of each sample). With `stream: true` the answer is OpenAI's
Server-Sent Events chunks ending with `data: [DONE]`; a choice is known only when its
rollout step ends, so the chunks are sent then (each choice in one content chunk), not
token by token.

Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}` (with the gateway's
`detail` and `field` beside it); anything the caller got wrong is a 400 whose `param`
names the field. The POST routes need the gateway's bearer token when one is configured,
like the SGLang API's mutating routes (OpenAI clients send it as their API key).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from bubblespec.batching import Answer, Ask, StepBatcher
from bubblespec.gateway.chat_template import ChatTemplate, ChatTemplateError
from bubblespec.gateway.scoring import Scorer
from bubblespec.gateway.service import GatewayService
from bubblespec.gateway.sglang import SglangFront, parse
from bubblespec.http.edge import protected_router
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import PromptIn, RolloutRequest
from bubblespec.protocol.openai import (
    ChatChoice,
    ChatCompletionIn,
    ChatCompletionOut,
    ChatLogprobs,
    ChatMessageOut,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionIn,
    CompletionLogprobs,
    CompletionOut,
    ErrorDetail,
    ErrorOut,
    ModelCard,
    ModelList,
    SamplingFields,
    Usage,
)
from bubblespec.protocol.sampling import SamplingParams

log = logging.getLogger("bubblespec.gateway.openai")

public = APIRouter()
protected = protected_router()

MIN_LOGPROB = -9999.0
"""Log-probs below this (-inf) are sent as this, as vLLM and OpenAI do (JSON has no inf)."""

_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                409: "ConflictError", 413: "RequestTooLargeError", 503: "ServiceUnavailableError"}


def oai_error(status: int, message: str, param: str = "") -> JSONResponse:
    """OpenAI's error body, with the gateway's `detail`/`field` beside it."""
    kind = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    body = ErrorOut(error=ErrorDetail(message=message, type=kind, param=param or None,
                                      code=status)).model_dump()
    return JSONResponse({**body, "detail": message, "field": param}, status_code=status)


@dataclass(frozen=True)
class Names:
    """How this request spells the fields an internal error may name."""

    prompt: str
    """`prompt` or `messages`."""
    budget: str
    """`max_tokens` or `max_completion_tokens`."""
    batched: bool = False
    """The prompts came as a list (name them `prompt[i]`)."""

    def of(self, internal: str) -> str:
        """A field of the internal rollout body (`prompts[1].input_ids[5]`,
        `sampling_params.max_new_tokens`) as this request spells it."""
        m = re.match(r"(next_)?prompts\[(\d+)\](?:\.(?:input_ids|text))?(\[\d+\])?", internal)
        if m:
            if m.group(1):
                return f"next_prompts[{m.group(2)}]"
            if self.prompt != "prompt":
                return self.prompt
            return self.prompt + (f"[{m.group(2)}]" if self.batched else "") + (m.group(3) or "")
        if internal.startswith(("prompts", "input_ids")):
            return self.prompt
        if internal.startswith("next_prompts"):
            return "next_prompts"
        if internal.startswith("seeds"):
            return "seed"
        if internal == "sampling_params.max_new_tokens":
            return self.budget
        return internal.removeprefix("sampling_params.")


@dataclass
class Choice:
    """One sampled choice, cut at its stop string if one occurred."""

    index: int
    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    stop_reason: int | str | None = None
    step: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """bubblespec's figures of the sample (step, weight version, speculation counters)."""


@dataclass
class Sampled:
    """What a request got: its prompts' ids and its choices, prompt-major."""

    prompts: list[list[int]]
    choices: list[Choice] = field(default_factory=list)

    def usage(self) -> Usage:
        p = sum(len(ids) for ids in self.prompts)
        c = sum(len(ch.ids) for ch in self.choices)
        return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


class OpenAiFront:
    """What the OpenAI routes answer from: the gateway's service and the SGLang API's
    step batcher (one batcher, so that both APIs' requests share steps)."""

    def __init__(self, gw: GatewayService, sglang: SglangFront) -> None:
        self.gw = gw
        self.sglang = sglang
        self._template: ChatTemplate | None = None
        self._template_loaded = False
        self._context: int | None = None
        self._context_loaded = False
        self._model = ""

    # ------------------------------------------------------------------ the model
    @property
    def batcher(self) -> StepBatcher:
        return self.sglang.batcher

    def _folder(self) -> Path | None:
        spec = self.gw.config.tokenizer
        if not spec:
            return None
        path = Path(spec)
        return path if path.is_dir() else path.parent

    def chat_template(self) -> ChatTemplate | None:
        """The model's chat template (loaded once; None: the model has none)."""
        if not self._template_loaded:
            try:
                self._template = ChatTemplate.load(self.gw.config.tokenizer)
            except (OSError, ValueError) as e:  # a broken file: chat is unavailable, said so
                log.error("cannot load the chat template of %s: %s", self.gw.config.tokenizer, e)
                self._template = None
            except Exception as e:  # noqa: BLE001 (a template Jinja cannot compile)
                log.error("cannot compile the chat template of %s: %s",
                          self.gw.config.tokenizer, e)
                self._template = None
            self._template_loaded = True
        return self._template

    def context_len(self) -> int | None:
        """The model's context length (`max_position_embeddings` of the config.json beside
        the gateway's tokenizer; None: unknown)."""
        if not self._context_loaded:
            folder = self._folder()
            if folder is None:
                from bubblespec.tasks import default_model_dir

                try:
                    folder = Path(default_model_dir())
                except FileNotFoundError:
                    folder = None
            try:
                cfg = json.loads((folder / "config.json").read_text()) if folder else {}
                value = cfg.get("max_position_embeddings")
                self._context = int(value) if isinstance(value, int) and value > 0 else None
            except (OSError, ValueError):
                self._context = None
            self._context_loaded = True
        return self._context

    async def model_id(self) -> str:
        """The served model's name: the ranks' model path (as vLLM names a model by its
        path), else the tokenizer's, else "bubblespec"."""
        if not self._model:
            self._model = await self.sglang.model_path()
        return self._model or self.gw.config.tokenizer or "bubblespec"

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.sglang.decode(list(ids), skip_special_tokens)

    @property
    def scorer(self) -> Scorer:
        """The prompt scorer (the SGLang API's: one scorer for both APIs)."""
        return self.sglang.scorer

    # ------------------------------------------------------------------ sampling
    def _budget(self, given: int | None, prompts: list[list[int]], names: Names) -> int:
        """max_new_tokens: the one given, else what the context leaves the longest prompt
        (vLLM's default)."""
        c = self.gw.config
        if given is not None:
            if given > c.max_new_tokens:
                raise ApiError(400, f"at most {c.max_new_tokens}", names.budget)
            return given
        ctx = self.context_len()
        if ctx is None:
            raise ApiError(400, "the gateway does not know the model's context length: give "
                                f"{names.budget}", names.budget)
        longest = max(len(p) for p in prompts)
        if longest >= ctx:
            raise ApiError(400, f"a prompt of {longest} tokens leaves no room in the model's "
                                f"context of {ctx} tokens", names.prompt)
        return min(ctx - longest, c.max_new_tokens)

    async def sample(self, prompts: list[list[int] | str], body: SamplingFields, budget: int | None,
                     names: Names) -> Sampled:
        """Check and tokenize the prompts, queue one ask per choice, wait for the step(s),
        and cut each choice at its stop string."""
        rollouts = self.gw.rollouts
        try:
            probe = RolloutRequest(
                prompts=[PromptIn(text=p) if isinstance(p, str) else PromptIn(input_ids=p)
                         for p in prompts],
                n=body.n, sampling_params=body.to_sampling(1),
                next_prompts=[PromptIn(text=p) if isinstance(p, str) else PromptIn(input_ids=p)
                              for p in body.next_prompts] if body.next_prompts else None)
        except ValidationError as e:
            raise ApiError(400, str(e.errors()[0].get("msg")), names.prompt) from None
        try:
            prep = rollouts.preparer.prepare(probe)  # limits and vocabulary, text tokenized
        except ApiError as e:
            raise ApiError(400 if e.status == 422 else e.status, e.detail,
                           names.of(e.field)) from None
        sampling = body.to_sampling(self._budget(budget, prep.prompts, names))
        try:
            rollouts.check_quarantine(
                prep.prompts, sampling,
                lambda i: names.of(f"prompts[{i}]") if names.batched else names.prompt)
        except ApiError as e:
            raise ApiError(400 if e.status == 422 else e.status, e.detail, e.field) from None
        for j, batch in enumerate(prep.next_batches):
            self.batcher.add_next(batch, ahead=j)
        rid = uuid.uuid4().hex
        asks = [Ask(ids, sampling, None if body.seed is None else body.seed + k,
                    f"{rid}-{i * body.n + k}")
                for i, ids in enumerate(prep.prompts) for k in range(body.n)]
        try:
            answers = await self.batcher.generate(asks)
        except ApiError as e:
            raise ApiError(400 if e.status == 422 else e.status, e.detail,
                           names.of(e.field)) from None
        except Exception as e:
            log.exception("OpenAI request failed")
            raise ApiError(502, f"rollout failed: {type(e).__name__}: {e}") from e
        out = Sampled(prompts=prep.prompts)
        for j, (ask, ans) in enumerate(zip(asks, answers)):
            out.choices.append(self.choice(j, body, sampling, ask, ans))
        return out

    def choice(self, index: int, body: SamplingFields, sampling: SamplingParams, ask: Ask,
               ans: Answer) -> Choice:
        """One answer as a choice: its text without the stop token, cut at a stop string."""
        s = ans.sample
        ids = [] if s is None else list(s.output_ids)
        lps = [] if s is None else list(s.output_logprobs or [])
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
                          ans.step, meta)
        return Choice(index, prompt_ids, ids, lps,
                      self.decode(text_ids, body.skip_special_tokens), reason, stop_reason,
                      ans.step, meta)

    def cut_at_stop(self, ids: list[int], stops: list[str], skip_special_tokens: bool,
                    include: bool) -> tuple[int, str, str] | None:
        """(index of the token that completed the first stop string, the text up to that
        string (through it when `include`), the string); None when no stop string occurs.

        The text is decoded token by token, as vLLM's detokenizer sees it, from the first
        token on; this is only done when the whole text holds a stop string."""
        if not stops or not ids:
            return None
        if not any(s in self.decode(ids, skip_special_tokens) for s in stops):
            return None
        for last in range(len(ids)):
            text = self.decode(ids[:last + 1], skip_special_tokens)
            hits = [(text.find(s), s) for s in stops if s in text]
            if hits:
                pos, stop = min(hits)
                return last, text[:pos + (len(stop) if include else 0)], stop
        return None


# ---------------------------------------------------------------------- answers
def _lp(x: float) -> float:
    return MIN_LOGPROB if math.isnan(x) else max(float(x), MIN_LOGPROB)


def completion_logprobs(f: OpenAiFront, ch: Choice) -> CompletionLogprobs:
    """The sampled tokens' log-probs in OpenAI's completion shape (`top_logprobs` holds the
    sampled token, what vLLM returns for `logprobs: 0`)."""
    tokens = [f.decode([t], False) for t in ch.ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    lps = [_lp(x) for x in ch.logprobs]
    return CompletionLogprobs(text_offset=offsets, token_logprobs=list(lps), tokens=tokens,
                              top_logprobs=[{t: lp} for t, lp in zip(tokens, lps)])


def chat_logprobs(f: OpenAiFront, ch: Choice) -> ChatLogprobs:
    content = []
    for t, lp in zip(ch.ids, ch.logprobs):
        tok = f.decode([t], False)
        content.append(ChatTokenLogprob(token=tok, logprob=_lp(lp),
                                        bytes=list(tok.encode("utf-8", errors="replace"))))
    return ChatLogprobs(content=content)


def completion_choice(f: OpenAiFront, body: CompletionIn, ch: Choice) -> CompletionChoice:
    return CompletionChoice(
        index=ch.index, text=ch.text, finish_reason=ch.finish_reason,
        stop_reason=ch.stop_reason,
        logprobs=completion_logprobs(f, ch) if body.logprobs is not None else None,
        token_ids=ch.ids if body.return_token_ids else None,
        prompt_token_ids=ch.prompt_ids if body.return_token_ids else None, bubblespec=ch.meta)


def chat_choice(f: OpenAiFront, body: ChatCompletionIn, ch: Choice) -> ChatChoice:
    return ChatChoice(
        index=ch.index, message=ChatMessageOut(content=ch.text),
        finish_reason=ch.finish_reason, stop_reason=ch.stop_reason,
        logprobs=chat_logprobs(f, ch) if body.logprobs else None,
        token_ids=ch.ids if body.return_token_ids else None, bubblespec=ch.meta)


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def completion_stream(out: CompletionOut, body: CompletionIn) -> StreamingResponse:
    """The answer as OpenAI's stream: one chunk per choice, the usage chunk if asked."""
    head = {"id": out.id, "object": "text_completion", "created": out.created,
            "model": out.model}
    chunks = [{**head, "choices": [c.model_dump(exclude_none=True) | {
        "logprobs": None if c.logprobs is None else c.logprobs.model_dump(),
        "finish_reason": c.finish_reason}]} for c in out.choices]
    if body.include_usage and out.usage is not None:
        chunks.append({**head, "choices": [], "usage": out.usage.model_dump()})
    return _sse(chunks)


def chat_stream(out: ChatCompletionOut, body: ChatCompletionIn) -> StreamingResponse:
    """The answer as OpenAI's chat stream: per choice a role chunk, then one content chunk
    with its log-probs and finish reason; the usage chunk if asked."""
    head = {"id": out.id, "object": "chat.completion.chunk", "created": out.created,
            "model": out.model}
    chunks: list[dict[str, Any]] = []
    for c in out.choices:
        first: dict[str, Any] = {**head, "choices": [{
            "index": c.index, "delta": {"role": "assistant", "content": ""},
            "logprobs": None, "finish_reason": None}]}
        if body.return_token_ids and not chunks:
            first["prompt_token_ids"] = out.prompt_token_ids
        last = {"index": c.index, "delta": {"content": c.message.content},
                "logprobs": None if c.logprobs is None else c.logprobs.model_dump(),
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if c.token_ids is not None:
            last["token_ids"] = c.token_ids
        if c.bubblespec is not None:
            last["bubblespec"] = c.bubblespec
        chunks += [first, {**head, "choices": [last]}]
    if body.include_usage and out.usage is not None:
        chunks.append({**head, "choices": [], "usage": out.usage.model_dump()})
    return _sse(chunks)


# ---------------------------------------------------------------------- routes
def front(request: Request) -> OpenAiFront:
    return request.app.state.openai


async def completions(f: OpenAiFront, body: CompletionIn) -> CompletionOut:
    prompts = body.prompts()
    names = Names("prompt", "max_tokens", batched=len(prompts) > 1 or (
        isinstance(body.prompt, list) and bool(body.prompt)
        and not isinstance(body.prompt[0], int)))
    if body.max_tokens == 0:
        if not body.echo:
            raise ApiError(400, "max_tokens 0 is served with echo (prompt scoring)",
                           "max_tokens")
        return await scored_completion(f, body, prompts, names)
    got = await f.sample(prompts, body, body.max_tokens, names)
    return CompletionOut(
        id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()),
        model=body.model or await f.model_id(),
        choices=[completion_choice(f, body, ch) for ch in got.choices], usage=got.usage())


async def scored_completion(f: OpenAiFront, body: CompletionIn,
                            prompts: list[list[int] | str], names: Names) -> CompletionOut:
    """`echo` + `max_tokens: 0`: each choice is its prompt's text, nothing generated (finish
    reason length), and with `logprobs: 0` the prompt tokens' log-probs in OpenAI's shape,
    as vLLM answers it: `tokens`, `token_logprobs` (the first null: it has no context),
    `top_logprobs` (the prompt token's own; null first) and `text_offset`. The prompts are
    scored on a rank without a rollout step (`scoring.py`); `n` copies per prompt."""
    ids: list[list[int]] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            try:
                p = f.gw.rollouts.preparer.tokenizer.encode(p)
            except Exception as e:  # noqa: BLE001 (a broken tokenizer must not be a 500)
                where = names.of(f"prompts[{i}]")
                raise ApiError(400, f"cannot tokenize: {e}", where) from None
        ids.append(list(p))
    scored = None
    if body.logprobs is not None:
        def field_of(rank_field: str) -> str:  # input_ids[i][j] -> prompt[i][j] / prompt[j]
            m = re.match(r"input_ids(\[\d+\])(.*)", rank_field)
            return names.of(f"prompts{m.group(1)}.input_ids{m.group(2)}") if m else names.prompt
        scored = await f.scorer.score(ids, field_of)
        meta: dict[str, Any] = {"step": None, "weight_version": scored.weight_version}
    else:
        meta = {"step": None, "weight_version": await f.sglang.weight_version()}
    choices = []
    for i, (p, pids) in enumerate(zip(prompts, ids)):
        text = p if isinstance(p, str) else f.decode(pids, body.skip_special_tokens)
        lps = None
        if scored is not None:
            tokens = [f.decode([t], False) for t in pids]
            offsets, at = [], 0
            for t in tokens:
                offsets.append(at)
                at += len(t)
            vals = [None if x is None else _lp(x) for x in scored.logprobs[i]]
            lps = CompletionLogprobs(
                text_offset=offsets, token_logprobs=vals, tokens=tokens,
                top_logprobs=[None if v is None else {t: v} for t, v in zip(tokens, vals)])
        for k in range(body.n):
            choices.append(CompletionChoice(
                index=i * body.n + k, text=text, logprobs=lps, finish_reason="length",
                token_ids=[] if body.return_token_ids else None,
                prompt_token_ids=pids if body.return_token_ids else None, bubblespec=meta))
    p_tokens = sum(len(x) for x in ids)  # once per prompt, as Sampled.usage counts them
    return CompletionOut(
        id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()),
        model=body.model or await f.model_id(), choices=choices,
        usage=Usage(prompt_tokens=p_tokens, completion_tokens=0, total_tokens=p_tokens))


async def chat_completions(f: OpenAiFront, body: ChatCompletionIn) -> ChatCompletionOut:
    template = f.chat_template()
    if template is None:
        raise ApiError(400, "the model has no chat template (its tokenizer_config.json has no "
                            "chat_template): use /v1/completions", "messages")
    try:
        text = template.render([m.template_dict() for m in body.messages],
                               body.add_generation_prompt, body.chat_template_kwargs)
        ids = f.gw.rollouts.preparer.tokenizer.encode(text, add_special_tokens=False)
    except ChatTemplateError as e:
        raise ApiError(400, str(e), "messages") from None
    except Exception as e:  # noqa: BLE001 (a tokenizer that fails on the text: this request's)
        raise ApiError(400, f"cannot tokenize the rendered conversation: {e}",
                       "messages") from None
    if not ids:
        raise ApiError(400, "the rendered conversation is empty", "messages")
    got = await f.sample([ids], body, body.budget, Names("messages", body.max_tokens_field))
    return ChatCompletionOut(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()),
        model=body.model or await f.model_id(),
        choices=[chat_choice(f, body, ch) for ch in got.choices], usage=got.usage(),
        prompt_token_ids=got.prompts[0] if body.return_token_ids else None)


async def _answer(request: Request, model: type[Any], run: Any, stream: Any) -> Any:
    """One route's shape: parse the body as `model`, run it, answer the errors in OpenAI's
    form (a 422 as 400, as vLLM does), stream it or answer it whole with `logprobs: null`
    kept on every choice (the openai client reads the key)."""
    try:
        body = await parse(request, model)
        out = await run(front(request), body)
    except ApiError as e:
        return oai_error(400 if e.status == 422 else e.status, e.detail, e.field)
    if body.stream:
        return stream(out, body)
    return JSONResponse(out.model_dump(exclude_none=True) | {
        "choices": [c.model_dump(exclude_none=True) | {"logprobs": None if c.logprobs is None
                                                       else c.logprobs.model_dump()}
                    for c in out.choices]})


@protected.post("/v1/completions")
async def post_completions(request: Request) -> Any:
    return await _answer(request, CompletionIn, completions, completion_stream)


@protected.post("/v1/chat/completions")
async def post_chat_completions(request: Request) -> Any:
    return await _answer(request, ChatCompletionIn, chat_completions, chat_stream)


@public.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    f = front(request)
    name = await f.model_id()
    card = ModelCard(id=name, created=int(time.time()), root=name,
                     max_model_len=f.context_len())
    return JSONResponse(ModelList(data=[card]).model_dump())


def install_openai(app: FastAPI, gw: GatewayService) -> None:
    """Mount the OpenAI-compatible routes on the gateway's `app` (after `install_sglang`,
    whose step batcher they share)."""
    app.state.openai = OpenAiFront(gw, app.state.sglang)
    app.include_router(protected)
    app.include_router(public)
