"""SGLang's native HTTP routes on the gateway (the package's docstring lists them)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from bubblespec.gateway.fronts import FrontServices, answer_json, for_caller, parse
from bubblespec.gateway.sglang.serving import SglangServing
from bubblespec.gateway.weight_groups import WeightGroups
from bubblespec.http.edge import protected_router
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.rank import WeightUpdate
from bubblespec.protocol.sglang import (
    AbortIn,
    GenerateIn,
    NextPromptsIn,
    PauseIn,
    WeightsFromDiskIn,
)
from bubblespec.protocol.weights import (
    DestroyWeightsGroupIn,
    InitWeightsGroupIn,
    MemoryTagsIn,
    WeightCommitIn,
    WeightsFromDistributedIn,
    WeightsFromTensorIn,
)

B = TypeVar("B", bound=BaseModel)
"""A weight route's body type."""

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
    e = for_caller(e)
    return sgl_error(e.status, e.detail, _sgl_field(e.field))


def _version() -> str:
    try:
        return metadata.version("bubblespec")
    except metadata.PackageNotFoundError:
        return "dev"


def front(request: Request) -> SglangServing:
    return request.app.state.sglang


def fronts(request: Request) -> FrontServices:
    return request.app.state.sglang.fronts


@protected.post("/generate")
async def generate(request: Request) -> JSONResponse:
    return await answer_json(request, GenerateIn, front(request).generate, api_error)


@protected.post("/v1/next_prompts")
async def next_prompts(request: Request) -> JSONResponse:
    try:
        body = await parse(request, NextPromptsIn)
    except ApiError as e:
        return api_error(e)
    batcher = fronts(request).batcher
    for j, batch in enumerate(body.batches()):
        batcher.add_next(batch, ahead=j)
    if body.pregen_window is not None:
        batcher.pregen_window = body.pregen_window
    window = batcher.pregen_window
    return JSONResponse({"success": True, "next_prompts": len(batcher.next_prompts),
                         "next_batches": [len(b) for b in batcher.next_batches],
                         "pregen_window": None if window is None else window.value})


@protected.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request) -> JSONResponse:
    f = fronts(request)
    try:
        body = await parse(request, WeightsFromDiskIn)
        if body.abort_all_requests:
            f.batcher.abort()
        res = await f.rollouts.update_weights(WeightUpdate(path=body.model_path,
                                                           version=body.version()))
    except ApiError as e:
        e = for_caller(e)
        return JSONResponse({"success": False, "message": e.detail,
                             "field": "weight_version" if e.field == "version" else
                             "model_path" if e.field == "path" else e.field,
                             "detail": e.detail}, status_code=e.status)
    return JSONResponse({"success": True, "message": "Succeeded to update model weights.",
                         "weight_version": str(res["weight_version"]),
                         "num_paused_requests": 0})


@protected.post("/abort_request")
async def abort_request(request: Request) -> JSONResponse:
    try:
        body = await parse(request, AbortIn)
    except ApiError as e:
        return api_error(e)
    f = fronts(request)
    n = f.batcher.abort(None if body.abort_all else body.rid)
    running = await f.abort_running() if body.abort_all else 0
    return JSONResponse({"success": True, "aborted_queued": n, "aborted_running": running})


@protected.post("/pause_generation")
async def pause_generation(request: Request) -> JSONResponse:
    try:
        body = await parse(request, PauseIn, empty_ok=True)
    except ApiError as e:
        return api_error(e)
    f = fronts(request)
    f.batcher.pause()
    queued = f.batcher.abort() if body.mode == "abort" else 0
    running = await f.abort_running() if body.mode == "abort" else 0
    return JSONResponse({"success": True, "message": "Generation paused.",
                         "aborted_queued": queued, "aborted_running": running})


@protected.post("/continue_generation")
async def continue_generation(request: Request) -> JSONResponse:
    """The end of a paused update (slime's marker): a staged process-group push is loaded
    on every rank first, then generation resumes."""
    f = fronts(request)
    try:
        committed = await f.weight_groups.commit()
    except ApiError as e:
        return weights_error(e)
    f.batcher.resume()
    out: dict[str, Any] = {"success": True, "message": "Generation continued."}
    if committed is not None:
        out["weight_version"] = str(committed["weight_version"])
    return JSONResponse(out)


def weights_error(e: ApiError) -> JSONResponse:
    """A weight call's failure as SGLang answers one (`success: false`, the status >= 400
    that slime checks, the field named)."""
    e = for_caller(e)
    return JSONResponse({"success": False, "message": e.detail, "field": e.field,
                         "detail": e.detail}, status_code=e.status)


async def _weight_call(request: Request, body_type: type[B],
                       run: Callable[[WeightGroups, B], Awaitable[dict[str, Any]]]
                       ) -> JSONResponse:
    """Parse `body_type`, run the weight-group call, answer `success: true` with what it
    returns, or the refusal as SGLang answers one (`weights_error`)."""
    try:
        body = await parse(request, body_type)
        out = await run(fronts(request).weight_groups, body)
    except ApiError as e:
        return weights_error(e)
    return JSONResponse({"success": True, **out})


@protected.post("/init_weights_update_group")
async def init_weights_update_group(request: Request) -> JSONResponse:
    async def run(g: WeightGroups, body: InitWeightsGroupIn) -> dict[str, Any]:
        return {"message": "Succeeded to initialize group.", **await g.open(body)}

    return await _weight_call(request, InitWeightsGroupIn, run)


@protected.post("/update_weights_from_distributed")
async def update_weights_from_distributed(request: Request) -> JSONResponse:
    async def run(g: WeightGroups, body: WeightsFromDistributedIn) -> dict[str, Any]:
        res = await g.bucket(body)
        return {"message": "Succeeded to update parameter online.",
                "weight_version": str(res["version"]), "staged": res["staged"]}

    return await _weight_call(request, WeightsFromDistributedIn, run)


@protected.post("/update_weights_from_tensor")
async def update_weights_from_tensor(request: Request) -> JSONResponse:
    """A colocated trainer's tensors, handed over in shared memory (CPU) or by CUDA IPC:
    every rank stages them; the call that completes the model loads it on every rank."""
    async def run(g: WeightGroups, body: WeightsFromTensorIn) -> dict[str, Any]:
        if body.abort_all_requests:
            fronts(request).batcher.abort()
        res = await g.tensors(body)
        return {"message": "Succeeded to update parameter online.",
                **res, "weight_version": str(res["weight_version"])}

    return await _weight_call(request, WeightsFromTensorIn, run)


@protected.post("/v1/weights/commit")
async def commit_weights(request: Request) -> JSONResponse:
    """bubblespec: load the staged push now (what `/continue_generation` does first)."""
    async def run(g: WeightGroups, body: WeightCommitIn) -> dict[str, Any]:
        res = await g.commit(body.group_name)
        if res is None:
            raise ApiError(409, "no pushed weights are staged", "weight_version")
        return {"weight_version": str(res["weight_version"]), "ranks": res["ranks"]}

    return await _weight_call(request, WeightCommitIn, run)


@protected.post("/release_memory_occupation")
async def release_memory_occupation(request: Request) -> JSONResponse:
    """Colocated trainers: pre-generation stops, the engines release their memory (vLLM's
    sleep), generation is refused (503) until it is resumed; weight pushes go on."""
    return await _memory(request, "release")


@protected.post("/resume_memory_occupation")
async def resume_memory_occupation(request: Request) -> JSONResponse:
    return await _memory(request, "resume")


async def _memory(request: Request, action: str) -> JSONResponse:
    async def run(g: WeightGroups, body: MemoryTagsIn) -> dict[str, Any]:
        return {"message": f"Succeeded to {action} memory.", **await g.memory(action, body.tags)}

    return await _weight_call(request, MemoryTagsIn, run)


@protected.post("/destroy_weights_update_group")
async def destroy_weights_update_group(request: Request) -> JSONResponse:
    async def run(g: WeightGroups, body: DestroyWeightsGroupIn) -> dict[str, Any]:
        return {"message": "Succeeded to destroy group.", **await g.close(body.group_name)}

    return await _weight_call(request, DestroyWeightsGroupIn, run)


@protected.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache() -> PlainTextResponse:
    return PlainTextResponse("Cache flushed.")


@public.get("/get_weight_version")
async def get_weight_version(request: Request) -> JSONResponse:
    return JSONResponse({"weight_version": str(await fronts(request).weight_version())})


@public.get("/get_model_info")
async def get_model_info(request: Request) -> JSONResponse:
    f = fronts(request)
    path = await f.model_path()
    return JSONResponse({
        "model_path": path, "tokenizer_path": f.config.tokenizer or path,
        "is_generation": True, "preferred_sampling_params": None,
        "weight_version": str(await f.weight_version()), "has_image_understanding": False,
        "has_audio_understanding": False, "model_type": None, "architectures": None})


@public.get("/get_server_info")
@public.get("/server_info")
async def get_server_info(request: Request) -> JSONResponse:
    f = fronts(request)
    d = await f.rollouts.discover()
    c = f.config
    return JSONResponse({
        "version": f"bubblespec-{_version()}", "server": "bubblespec gateway",
        "weight_version": str(max((r.weight_version or 0 for r in d.ready), default=0)),
        "dp_size": len(d.ready), "ranks": [r.as_dict() for r in d.ranks],
        "max_new_tokens": c.max_new_tokens, "max_prompt_tokens": c.max_prompt_tokens,
        "sglang_quiet_s": c.sglang_quiet_s, "sglang_max_wait_s": c.sglang_max_wait_s,
        "steps_run": f.batcher.steps_run, "last_step": f.rollouts.last_step,
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
    b = fronts(request).batcher
    return JSONResponse({"timestamp": time.time(), "paused": b.paused,
                         "next_prompts": len(b.next_prompts),
                         "loads": [{"dp_rank": 0, "num_running_reqs": len(b.running),
                                    "num_waiting_reqs": len(b.queue)}]})
