"""What the trainer-API fronts share (`gateway/openai/`, `gateway/sglang/`).

Both fronts answer from the same services, written once here:

- one step batcher (`steps.py`): concurrent requests of both APIs share rollout steps, and a
  next-prompts hint from either goes with the next step that starts; the step it runs is
  numbered here, so that an abort can name it while it runs;
- one prompt scorer (`scoring.py`), outside the steps, and one check of structured-output
  constraints on a rank before a step takes them (`constraints.py`);
- the tokenizer: prompts as token ids, or a 400 naming the caller's field (`token_ids`,
  `encode`), and text of ids (`decode`: a courtesy, never an error);
- the model: its path as the ranks report it, its context length and chat template (read
  beside the gateway's tokenizer), the weight version of the ready ranks;
- the body parser (`parse`: a 400 naming the field, as both APIs answer) and the one rule
  for errors of the rollout path: a 422 (a body the rollout refused) is the caller's 400
  (`for_caller`), as vLLM's and SGLang's servers answer it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from bubblespec.batching import StepBatcher
from bubblespec.gateway.chat_template import ChatTemplate
from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.constraints import ConstraintCheck
from bubblespec.gateway.rollout import Rollouts
from bubblespec.gateway.scoring import Scorer
from bubblespec.gateway.steps import step_batcher
from bubblespec.gateway.weight_groups import WeightGroups
from bubblespec.http.errors import error_field
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import RolloutRequest, RolloutResponse
from bubblespec.protocol.limits import TopLogprobs, clamp_logprob
from bubblespec.protocol.openai import ChatLogprobs, ChatTokenLogprob, ErrorDetail, ErrorOut
from bubblespec.protocol.sampling import SamplingParams

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("bubblespec.gateway.fronts")


async def parse(request: Request, model: type[M], empty_ok: bool = False) -> M:
    """The request body as `model`; ApiError 400 naming the field otherwise."""
    raw = await request.body()
    if not raw.strip() and empty_ok:
        return model()
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, f"body is not JSON: {e}", "body") from None
    except RecursionError:
        raise ApiError(400, "body is nested too deeply", "body") from None
    try:
        return model.model_validate(body)
    except RecursionError:
        raise ApiError(400, "body is nested too deeply", "body") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = error_field({**err, "loc": ("body", *err["loc"])}, body)
        raise ApiError(400, f"{where}: {err['msg']}", where) from None


async def answer_json(request: Request, model: type[M],
                      run: Callable[[M], Awaitable[Any]],
                      error: Callable[[ApiError], JSONResponse]) -> JSONResponse:
    """A route's answer: the body parsed as `model`, `run(body)` answered as JSON, an
    `ApiError` on the way answered by `error` (the front's error shape)."""
    try:
        return JSONResponse(await run(await parse(request, model)))
    except ApiError as e:
        return error(e)


def for_caller(e: ApiError, field: str | None = None) -> ApiError:
    """An error of the rollout path as a front's caller gets it: a 422 (the rollout refused
    the body) as 400, the field as the caller spells it (`field`, else the error's own)."""
    return ApiError(400 if e.status == 422 else e.status, e.detail,
                    e.field if field is None else field)


_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                409: "ConflictError", 413: "RequestTooLargeError", 503: "ServiceUnavailableError"}


def oai_error(status: int, message: str, param: str = "") -> JSONResponse:
    """The error body of OpenAI's API and of every vLLM route (`{"error": {"message", "type",
    "param", "code"}}`), with the gateway's `detail`/`field` beside it."""
    kind = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    body = ErrorOut(error=ErrorDetail(message=message, type=kind, param=param or None,
                                      code=status)).model_dump()
    return JSONResponse({**body, "detail": message, "field": param}, status_code=status)




def position_entries(top: TopLogprobs | None, i: int, token: int,
                     logprob: float) -> list[tuple[int, float]]:
    """Output position i's [token id, log-prob] entries in vLLM's order (the sampled token
    first, then by rank); only the sampled token when no alternatives were asked for."""
    if top is not None and i < len(top) and top[i]:
        return [(int(t), float(lp)) for t, lp in top[i]]
    return [(token, logprob)]


def chat_logprobs(f: FrontServices, ids: list[int], lps: list[float],
                  top: TopLogprobs | None, n: int, as_id: bool = False) -> ChatLogprobs:
    """Log-probs in OpenAI's chat shape (vLLM's chat route and the generate route's text
    mode): each token's text, log-prob and bytes with the first n entries of vLLM's list;
    `as_id` spells tokens `token_id:<id>` (vLLM's `return_tokens_as_token_ids`)."""
    content = []
    for i, (t, lp) in enumerate(zip(ids, lps)):
        text = f.decode([t], False)
        alts = []
        for a, alp in position_entries(top, i, t, lp)[:n]:
            tok = f"token_id:{a}" if as_id else f.decode([a], False)
            alts.append({"token": tok, "logprob": clamp_logprob(alp),
                         "bytes": list(tok.encode("utf-8", errors="replace"))})
        content.append(ChatTokenLogprob(token=f"token_id:{t}" if as_id else text,
                                        logprob=clamp_logprob(lp), top_logprobs=alts,
                                        bytes=list(text.encode("utf-8", errors="replace"))))
    return ChatLogprobs(content=content)


def sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    """`chunks` as Server-Sent Events ending with `data: [DONE]` (OpenAI's and vLLM's)."""
    async def events() -> AsyncIterator[bytes]:
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


class FrontServices:
    """The services both trainer-API fronts answer from (see the module's docstring).

    `rollouts` gives the gateway's `Rollouts` (set up in the app's lifespan; it raises a 503
    while the gateway starts)."""

    def __init__(self, config: GatewayConfig, rollouts: Callable[[], Rollouts]) -> None:
        self.config = config
        self._rollouts = rollouts
        self.running_step: int | None = None
        """The step the batcher runs now (None between steps)."""
        self.batcher: StepBatcher = step_batcher(self._run, config.sglang_quiet_s,
                                                 config.sglang_max_wait_s, config.max_n)
        self._scorer: Scorer | None = None
        self._constraints: ConstraintCheck | None = None
        self._template: ChatTemplate | None = None
        self._template_loaded = False
        self._context: int | None = None
        """The ranks' served context length, once one reported it."""
        self._model_ctx: int | None = None
        self._model_context_loaded = False
        self._model = ""
        self._weight_groups: WeightGroups | None = None

    @property
    def rollouts(self) -> Rollouts:
        return self._rollouts()

    @property
    def weight_groups(self) -> WeightGroups:
        """The trainer's process-group weight pushes (`weight_groups.py`)."""
        if self._weight_groups is None:
            self._weight_groups = WeightGroups(self.rollouts)
        return self._weight_groups

    async def _run(self, req: RolloutRequest) -> RolloutResponse:
        """One rollout step of the batcher, numbered here so that an abort can name it."""
        rollouts = self.rollouts
        if rollouts.last_step is None:
            step = rollouts.next_step(await rollouts.discover())  # the rule /v1/rollout uses
        else:
            step = rollouts.last_step + 1
        self.running_step = step
        try:
            return await rollouts.rollout(req.model_copy(update={"step": step}))
        finally:
            self.running_step = None

    async def abort_running(self) -> int:
        """Abort the step now running on every rank (its unfinished samples answer with
        finish reason abort and the tokens they have); how many asks it holds."""
        step = self.running_step
        if not self.batcher.running or step is None:
            return 0
        rollouts = self.rollouts
        d = await rollouts.discover()
        await asyncio.gather(*(rollouts.pool.post(r, "/v1/abort_step", {"step": step},
                                                  self.config.probe_timeout_s)
                               for r in d.ready), return_exceptions=True)
        return len(self.batcher.running)

    @property
    def scorer(self) -> Scorer:
        """The prompt scorer (one for both APIs: its turn and counters are shared)."""
        if self._scorer is None:
            self._scorer = Scorer(self.rollouts)
        return self._scorer

    async def check_constraint(self, sampling: SamplingParams, field: str,
                               bad_words_field: str = "bad_words") -> None:
        """A 400 naming `field` when the ranks cannot build `sampling`'s structured-output
        constraint, `bad_words_field` when they cannot tokenize a bad word
        (`constraints.py`), before a step takes it."""
        if sampling.structured is None and not sampling.bad_words:
            return
        if self._constraints is None:
            self._constraints = ConstraintCheck(self.rollouts)
        await self._constraints.check(sampling, field, bad_words_field)

    # ------------------------------------------------------------------ the tokenizer
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        try:
            return self.rollouts.preparer.tokenizer.decode(list(ids), skip_special_tokens)
        except Exception:  # noqa: BLE001 (text is a courtesy; ids and logprobs are the data)
            return ""

    def encode(self, text: str, where: str, add_special_tokens: bool = True) -> list[int]:
        """`text` as token ids; ApiError 400 naming `where` when the tokenizer fails on it."""
        try:
            return list(self.rollouts.preparer.tokenizer.encode(
                text, add_special_tokens=add_special_tokens))
        except Exception as e:  # noqa: BLE001 (a broken tokenizer must not be a 500)
            raise ApiError(400, f"{where}: cannot tokenize: {e}", where) from None

    def token_ids(self, prompts: Sequence[Sequence[int] | str],
                  where: Callable[[int], str]) -> list[list[int]]:
        """Each prompt as token ids (text tokenized as a rollout step does); a prompt the
        tokenizer fails on is a 400 naming `where(i)`."""
        return [self.encode(p, where(i)) if isinstance(p, str) else list(p)
                for i, p in enumerate(prompts)]

    def check_quarantine(self, prompts: Sequence[Sequence[int] | str],
                         sampling: SamplingParams, where: Callable[[int], str]) -> None:
        """Refuse a quarantined request before it is queued (a 400 for this caller only, not
        for the others batched into the same step). A prompt the tokenizer fails on is
        left to the step's own tokenization, which names it."""
        ids = []
        for i, p in enumerate(prompts):
            try:
                ids.append(self.encode(p, where(i)) if isinstance(p, str) else list(p))
            except ApiError:
                continue
        try:
            self.rollouts.check_quarantine(ids, sampling, where)
        except ApiError as e:
            raise for_caller(e) from None

    async def budgets(self, given: int | None, prompts: Sequence[Sequence[int]],
                      budget_field: str, prompt_field: Callable[[int], str]) -> list[int]:
        """max_new_tokens of each prompt, as vLLM's server sets it: the one given (at most
        the gateway's `max_new_tokens`), else the gateway's; either cut to what the context
        leaves the prompt. A prompt that fills the context is a 400 in vLLM's words."""
        c = self.config
        if given is not None and given > c.max_new_tokens:
            raise ApiError(400, f"at most {c.max_new_tokens}", budget_field)
        ctx = await self.context_len()
        if ctx is None:
            if given is None:
                raise ApiError(400, "the gateway does not know the model's context length: "
                                    f"give {budget_field}", budget_field)
            return [given] * len(prompts)
        out = []
        for i, p in enumerate(prompts):
            if len(p) >= ctx:
                raise ApiError(400, f"This model's maximum context length is {ctx} tokens. "
                                    f"However, your prompt contains {len(p)} input tokens, "
                                    "which exceeds this limit even without any output "
                                    "tokens. Please reduce the length of the input prompt.",
                               prompt_field(i))
            out.append(min(ctx - len(p), c.max_new_tokens if given is None else given))
        return out

    # ------------------------------------------------------------------ the model
    async def weight_version(self) -> int:
        """The newest weight version among the ready ranks (0 before any update)."""
        d = await self.rollouts.discover()
        return max((r.weight_version or 0 for r in d.ready), default=0)

    async def _rank_config(self) -> dict[str, Any] | None:
        """The configuration the first answering ready rank reports (None: none answers)."""
        rollouts = self.rollouts
        d = await rollouts.discover()
        for r in d.ready:
            try:
                cfg = (await rollouts.pool.http.get(
                    f"{r.url}/config", timeout=self.config.probe_timeout_s)).json()
            except (httpx.HTTPError, ValueError):  # informational: try the next rank
                log.debug("GET %s/config failed", r.url)
                continue
            if isinstance(cfg, dict):
                return cfg
        return None

    async def model_path(self) -> str:
        """The model path the first answering ready rank reports ("" when none answers)."""
        cfg = await self._rank_config()
        if cfg is None:
            return ""
        engine = cfg.get("engine") if isinstance(cfg.get("engine"), dict) else {}
        return str(cfg.get("model") or engine.get("model") or "")

    async def model_id(self) -> str:
        """The served model's name: the ranks' model path (as vLLM names a model by its
        path), else the tokenizer's, else "bubblespec"."""
        if not self._model:
            self._model = await self.model_path()
        return self._model or self.config.tokenizer or "bubblespec"

    def _folder(self) -> Path | None:
        spec = self.config.tokenizer
        if not spec:
            return None
        path = Path(spec)
        return path if path.is_dir() else path.parent

    def chat_template(self) -> ChatTemplate | None:
        """The model's chat template (loaded once; None: the model has none)."""
        if not self._template_loaded:
            try:
                self._template = ChatTemplate.load(self.config.tokenizer)
            except (OSError, ValueError) as e:  # a broken file: chat is unavailable, said so
                log.error("cannot load the chat template of %s: %s", self.config.tokenizer, e)
                self._template = None
            except Exception as e:  # noqa: BLE001 (a template Jinja cannot compile)
                log.error("cannot compile the chat template of %s: %s",
                          self.config.tokenizer, e)
                self._template = None
            self._template_loaded = True
        return self._template

    async def context_len(self) -> int | None:
        """The context length the ranks serve (their engine's `max_model_len`, read once a
        rank answers), else the model's (`max_position_embeddings` of the config.json beside
        the gateway's tokenizer); None: unknown."""
        if self._context is None:
            cfg = await self._rank_config()
            served = cfg.get("served") if cfg is not None else None
            value = served.get("max_model_len") if isinstance(served, dict) else None
            if isinstance(value, int) and value > 0:
                self._context = value
        return self._context if self._context is not None else self._model_context()

    def _model_context(self) -> int | None:
        """`max_position_embeddings` of the model's config.json (read once; None: unknown)."""
        if not self._model_context_loaded:
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
                self._model_ctx = int(value) if isinstance(value, int) and value > 0 else None
            except (OSError, ValueError):
                self._model_ctx = None
            self._model_context_loaded = True
        return self._model_ctx
