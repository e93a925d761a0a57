"""SGLang's native HTTP API on the gateway, so that slime and AReaL switch by address.

Routes (SGLang's names, bodies and answers; bodies in `bubblespec.protocol.sglang`):

- POST /generate  single or batched `input_ids`/`text`, `sampling_params` (n included),
  `return_logprob`; answers `text`, `output_ids` and `meta_info` (finish_reason,
  prompt/completion/cached tokens, `output_token_logprobs` as [logprob, token id, null],
  weight_version, and the speculation counters under `bubblespec`). Concurrent requests are
  batched into rollout steps (`sglang_steps.py`); `next_input_ids` hands the next step's
  prompts ahead. `max_new_tokens: 0` scores the prompts instead (no step, `scoring.py`):
  `input_token_logprobs` from `logprob_start_len` on;
- POST /v1/next_prompts  the next step's prompts alone, or the next steps' batches (bubblespec);
- POST /update_weights_from_disk  {model_path, weight_version}: every rank reloads;
- POST /abort_request  {rid}: that request if still queued; {abort_all}: every queued
  request, and the running step on every rank (its unfinished samples answer with finish
  reason abort and the tokens they have, which AReaL re-sends as prompt + partial output);
- POST /pause_generation  no new step until /continue_generation; mode "abort" (SGLang's
  default) aborts as abort_all does, "retract"/"in_place" let the running step finish;
- GET|POST /flush_cache (nothing to flush: 200);
- GET /get_model_info, /get_server_info (= /server_info), /get_weight_version, /v1/loads,
  and the SGLang router's /workers (the gateway itself: slime drains through it).

The mutating routes need the gateway's bearer token when one is configured, as SGLang's
`--api-key` does. Errors are SGLang's `{"error": {"message"}}` with the gateway's `detail`
and `field` beside it; anything the caller got wrong is a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from importlib import metadata
from typing import Any, TypeVar

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ValidationError

from bubblespec.batching import Answer, Ask
from bubblespec.gateway.scoring import Scorer, rank_field_batched
from bubblespec.gateway.service import GatewayService
from bubblespec.gateway.sglang_steps import sglang_batcher
from bubblespec.http.edge import protected_router
from bubblespec.http.errors import error_field
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import RolloutRequest, RolloutResponse
from bubblespec.protocol.rank import WeightUpdate
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.protocol.sglang import (
    AbortIn,
    FinishReason,
    GenerateIn,
    NextPromptsIn,
    PauseIn,
    SglMetaInfo,
    SglSampleMeta,
    WeightsFromDiskIn,
)

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("bubblespec.gateway.sglang")

public = APIRouter()
protected = protected_router()


def sgl_error(status: int, message: str, field: str = "") -> JSONResponse:
    """SGLang's error body, with the gateway's `detail`/`field` beside it."""
    return JSONResponse({"error": {"message": message, "code": status, "field": field},
                         "detail": message, "field": field}, status_code=status)


def _sgl_field(field: str) -> str:
    """A field of the internal rollout body as the SGLang request spells it."""
    if field.startswith("next_prompts"):
        return "next_input_ids"
    if field.startswith("prompts") or field == "n":
        return "input_ids"
    return field


def api_error(e: ApiError) -> JSONResponse:
    status = 400 if e.status == 422 else e.status
    return sgl_error(status, e.detail, _sgl_field(e.field))


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


class SglangFront:
    """What the SGLang routes answer from: the gateway's service and the step batcher."""

    def __init__(self, gw: GatewayService) -> None:
        c = gw.config
        self.gw = gw
        self.running_step: int | None = None
        self.batcher = sglang_batcher(self._run, c.sglang_quiet_s, c.sglang_max_wait_s,
                                      c.max_n)
        self._scorer: Scorer | None = None

    async def _run(self, req: RolloutRequest) -> RolloutResponse:
        """One rollout step, numbered here so that an abort can name it while it runs."""
        rollouts = self.gw.rollouts
        if rollouts.last_step is None:
            step = rollouts._next_step(await rollouts.discover())  # the rule /v1/rollout uses
        else:
            step = rollouts.last_step + 1
        self.running_step = step
        try:
            return await rollouts.rollout(req.model_copy(update={"step": step}))
        finally:
            self.running_step = None

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        try:
            return self.gw.rollouts.preparer.tokenizer.decode(ids, skip_special_tokens)
        except Exception:  # noqa: BLE001 (text is a courtesy; ids and logprobs are the data)
            return ""

    def out(self, body: GenerateIn, ask: Ask, ans: Answer, t0: float) -> dict[str, Any]:
        """One SGLang answer of one sample."""
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
                (lp, t, self.decode([t], False) if body.return_text_in_logprobs else None)
                for lp, t in zip(lps, ids)]
        if s is not None:
            meta.bubblespec = SglSampleMeta(step=ans.step, **dict(s.meta))
        return {"text": self.decode(text_ids, sp.skip_special_tokens), "output_ids": ids,
                "meta_info": meta.model_dump(mode="json", exclude_unset=True)}

    async def generate(self, body: GenerateIn) -> Any:
        t0 = time.monotonic()
        if body.next_input_ids:
            self.batcher.add_next(body.next_input_ids)
        sp = body.sampling_params
        if sp.n > self.gw.config.max_n:
            raise ApiError(400, f"at most {self.gw.config.max_n} samples per prompt",
                           "sampling_params.n")
        if sp.max_new_tokens == 0:
            return await self.score(body, t0)
        sampling = sp.to_sampling()
        self._check_quarantine(body, sampling)
        asks = []
        for prompt, rid in zip(body.prompts(), body.rids()):
            base = rid or uuid.uuid4().hex
            for k in range(sp.n):
                seed = None if sp.sampling_seed is None else sp.sampling_seed + k
                asks.append(Ask(prompt, sampling, seed, base if sp.n == 1 else f"{base}-{k}"))
        answers = await self.batcher.generate(asks)
        outs = [self.out(body, a, ans, t0) for a, ans in zip(asks, answers)]
        return outs if body.batched or sp.n > 1 else outs[0]

    @property
    def scorer(self) -> Scorer:
        if self._scorer is None:
            self._scorer = Scorer(self.gw.rollouts)
        return self._scorer

    def _ids(self, body: GenerateIn) -> list[list[int]]:
        """The prompts as token ids (text prompts tokenized as a rollout step does)."""
        ids = []
        for i, p in enumerate(body.prompts()):
            if isinstance(p, str):
                try:
                    p = self.gw.rollouts.preparer.tokenizer.encode(p)
                except Exception as e:  # noqa: BLE001 (a broken tokenizer must not be a 500)
                    where = f"text[{i}]" if body.batched else "text"
                    raise ApiError(400, f"{where}: cannot tokenize: {e}", where) from None
            ids.append(list(p))
        return ids

    async def score(self, body: GenerateIn, t0: float) -> Any:
        """`max_new_tokens: 0`: nothing is generated (`output_ids` [], finish reason length 0,
        as SGLang answers). With `return_logprob` and `logprob_start_len` >= 0 the prompts
        are scored on a rank (`scoring.py`: no rollout step) and `input_token_logprobs`
        holds [log-prob, token id, text or null] of each prompt token from that position on
        (the first prompt token's log-prob null), as slime's distillation teacher reads
        them; raw log-probs, before any temperature. Otherwise no rank is called. `n`
        copies per prompt, as SGLang answers n samples of zero tokens."""
        sp = body.sampling_params
        prompts = self._ids(body)
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
            scored = await self.scorer.score(prompts, rank_field_batched(body.batched))
            version = scored.weight_version
        else:
            version = await self.weight_version()
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
                        (lp, t, self.decode([t], False) if body.return_text_in_logprobs
                         else None)
                        for lp, t in zip(scored.logprobs[i][start:], p[start:])]
                outs.append({"text": "", "output_ids": [],
                             "meta_info": meta.model_dump(mode="json", exclude_unset=True)})
        return outs if body.batched or sp.n > 1 else outs[0]

    def _check_quarantine(self, body: GenerateIn, sampling: SamplingParams) -> None:
        """Refuse a quarantined request before it is queued (a 4xx for this caller only,
        not for the others batched into the same step)."""
        rollouts = self.gw.rollouts
        ids = []
        for p in body.prompts():
            if isinstance(p, str):
                try:
                    p = rollouts.preparer.tokenizer.encode(p)
                except Exception:  # noqa: BLE001, S112 (the step's tokenization reports it)
                    continue
            ids.append(list(p))
        rollouts.check_quarantine(ids, sampling,
                                  lambda i: f"input_ids[{i}]" if body.batched else "input_ids")

    async def abort_running(self) -> int:
        """Abort the step now running on every rank (its unfinished samples answer with
        finish reason abort and the tokens they have); how many asks it holds."""
        step = self.running_step
        if not self.batcher.running or step is None:
            return 0
        rollouts = self.gw.rollouts
        d = await rollouts.discover()
        await asyncio.gather(*(rollouts.pool.post(r, "/v1/abort_step", {"step": step},
                                                  self.gw.config.probe_timeout_s)
                               for r in d.ready), return_exceptions=True)
        return len(self.batcher.running)

    async def weight_version(self) -> int:
        d = await self.gw.rollouts.discover()
        return max((r.weight_version or 0 for r in d.ready), default=0)

    async def model_path(self) -> str:
        d = await self.gw.rollouts.discover()
        for r in d.ready:
            try:
                cfg = (await self.gw.rollouts.pool.http.get(
                    f"{r.url}/config", timeout=self.gw.config.probe_timeout_s)).json()
            except (httpx.HTTPError, ValueError):  # informational: try the next rank
                log.debug("GET %s/config failed", r.url)
                continue
            engine = cfg.get("engine") if isinstance(cfg.get("engine"), dict) else {}
            return str(cfg.get("model") or engine.get("model") or "")
        return ""


def _version() -> str:
    try:
        return metadata.version("bubblespec")
    except metadata.PackageNotFoundError:
        return "dev"


def front(request: Request) -> SglangFront:
    return request.app.state.sglang


@protected.post("/generate")
async def generate(request: Request) -> JSONResponse:
    try:
        body = await parse(request, GenerateIn)
        return JSONResponse(await front(request).generate(body))
    except ApiError as e:
        return api_error(e)


@protected.post("/v1/next_prompts")
async def next_prompts(request: Request) -> JSONResponse:
    try:
        body = await parse(request, NextPromptsIn)
    except ApiError as e:
        return api_error(e)
    batcher = front(request).batcher
    for j, batch in enumerate(body.batches()):
        batcher.add_next(batch, ahead=j)
    return JSONResponse({"success": True, "next_prompts": len(batcher.next_prompts),
                         "next_batches": [len(b) for b in batcher.next_batches]})


@protected.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request) -> JSONResponse:
    f = front(request)
    try:
        body = await parse(request, WeightsFromDiskIn)
        if body.abort_all_requests:
            f.batcher.abort()
        res = await f.gw.update_weights(WeightUpdate(path=body.model_path,
                                                     version=body.version()))
    except ApiError as e:
        status = 400 if e.status == 422 else e.status
        return JSONResponse({"success": False, "message": e.detail,
                             "field": "weight_version" if e.field == "version" else
                             "model_path" if e.field == "path" else e.field,
                             "detail": e.detail}, status_code=status)
    return JSONResponse({"success": True, "message": "Succeeded to update model weights.",
                         "weight_version": str(res["weight_version"]),
                         "num_paused_requests": 0})


@protected.post("/abort_request")
async def abort_request(request: Request) -> JSONResponse:
    try:
        body = await parse(request, AbortIn)
    except ApiError as e:
        return api_error(e)
    f = front(request)
    n = f.batcher.abort(None if body.abort_all else body.rid)
    running = await f.abort_running() if body.abort_all else 0
    return JSONResponse({"success": True, "aborted_queued": n, "aborted_running": running})


@protected.post("/pause_generation")
async def pause_generation(request: Request) -> JSONResponse:
    try:
        body = await parse(request, PauseIn, empty_ok=True)
    except ApiError as e:
        return api_error(e)
    f = front(request)
    f.batcher.pause()
    queued = f.batcher.abort() if body.mode == "abort" else 0
    running = await f.abort_running() if body.mode == "abort" else 0
    return JSONResponse({"success": True, "message": "Generation paused.",
                         "aborted_queued": queued, "aborted_running": running})


@protected.post("/continue_generation")
async def continue_generation(request: Request) -> JSONResponse:
    front(request).batcher.resume()
    return JSONResponse({"success": True, "message": "Generation continued."})


@protected.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache() -> PlainTextResponse:
    return PlainTextResponse("Cache flushed.")


@public.get("/get_weight_version")
async def get_weight_version(request: Request) -> JSONResponse:
    return JSONResponse({"weight_version": str(await front(request).weight_version())})


@public.get("/get_model_info")
async def get_model_info(request: Request) -> JSONResponse:
    f = front(request)
    path = await f.model_path()
    return JSONResponse({
        "model_path": path, "tokenizer_path": f.gw.config.tokenizer or path,
        "is_generation": True, "preferred_sampling_params": None,
        "weight_version": str(await f.weight_version()), "has_image_understanding": False,
        "has_audio_understanding": False, "model_type": None, "architectures": None})


@public.get("/get_server_info")
@public.get("/server_info")
async def get_server_info(request: Request) -> JSONResponse:
    f = front(request)
    d = await f.gw.rollouts.discover()
    c = f.gw.config
    return JSONResponse({
        "version": f"bubblespec-{_version()}", "server": "bubblespec gateway",
        "weight_version": str(max((r.weight_version or 0 for r in d.ready), default=0)),
        "dp_size": len(d.ready), "ranks": [r.as_dict() for r in d.ranks],
        "max_new_tokens": c.max_new_tokens, "max_prompt_tokens": c.max_prompt_tokens,
        "sglang_quiet_s": c.sglang_quiet_s, "sglang_max_wait_s": c.sglang_max_wait_s,
        "steps_run": f.batcher.steps_run, "last_step": f.gw.rollouts.last_step,
        "internal_states": [{"num_running_reqs": len(f.batcher.running),
                             "num_waiting_reqs": len(f.batcher.queue),
                             "paused": f.batcher.paused}]})


@public.get("/workers")
async def workers(request: Request) -> JSONResponse:
    """SGLang router's worker list: the gateway itself (slime aborts through each worker)."""
    return JSONResponse({"workers": [{"id": "bubblespec-gateway",
                                      "url": str(request.base_url).rstrip("/")}]})


@public.get("/v1/loads")
async def loads(request: Request) -> JSONResponse:
    b = front(request).batcher
    return JSONResponse({"timestamp": time.time(), "paused": b.paused,
                         "next_prompts": len(b.next_prompts),
                         "loads": [{"dp_rank": 0, "num_running_reqs": len(b.running),
                                    "num_waiting_reqs": len(b.queue)}]})


def install_sglang(app: FastAPI, gw: GatewayService) -> None:
    """Mount the SGLang-compatible routes on the gateway's `app`."""
    app.state.sglang = SglangFront(gw)
    app.include_router(protected)
    app.include_router(public)
