"""The rank server's HTTP routes (bodies in `bubblespec/protocol/rank.py`, logic in `service.py`).

- POST /v1/step_shard  this rank's share of a step, then pre-generation (bearer token)
- POST /generate       SGLang-style token-in generation, single or batched (bearer token)
- POST /v1/score      the prompt log-probs of token-id prompts, without generating (bearer
                       token); no step: the rank's state and pre-generation are untouched
- POST /v1/check_sampling  would the engine take these sampling parameters (a structured-
                       output constraint compiled by its backend)? 400 naming the field, or {}
- POST /v1/tool_calls  vLLM's tool parser over chat outputs (the gateway's tool_choice auto)
- POST /v1/abort_step  end this rank's shard of a step early (bearer token): its unfinished
                       samples return what they generated with finish reason abort
- POST /v1/weights     validate, then reload weights from a directory (bearer token): 422
                       (field path) for a checkpoint that does not match the model, 409
                       (field version) for a version that does not go up without `force`
- GET  /v1/state       rank id, state, weight version, step, address
- GET  /v1/draft_index the proposer's draft index against its budgets
- GET  /v1/heap        the engine worker's memory split (RSS, glibc heap, forward shapes)
- GET  /v1/pace        paced forwards and overruns (ranks started with `--pace`)
- GET  /health (live), GET /health_generate (ready while the engine is up: 503 while it
  starts or after it died), GET /metrics, GET /config

Bad input answers 4xx naming the field; routes that need the engine answer 503 until it is up.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from bubblespec.http.edge import app_service, protected_router
from bubblespec.metrics import CONTENT_TYPE_LATEST
from bubblespec.protocol.rank import (
    AbortStep,
    CheckSampling,
    DraftIndexBody,
    GenerateRequest,
    HeapBody,
    PaceBody,
    ParseToolCalls,
    RankStateBody,
    ScoreRequest,
    StepShard,
    WeightUpdate,
)
from bubblespec.protocol.weights import (
    MemoryTagsIn,
    TensorBucket,
    WeightBucket,
    WeightGroupClose,
    WeightGroupOpen,
)
from bubblespec.rank.service import RankService

Rank = Annotated[RankService, Depends(app_service)]

#: Routes anyone may call.
public = APIRouter()
#: Routes that need the bearer token (checked before the body is read).
protected = protected_router()


@public.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@public.get("/health_generate")
async def health_generate(rank: Rank) -> JSONResponse:
    status, body = rank.health_generate()
    return JSONResponse(body, status_code=status)


@public.get("/metrics")
async def metrics(rank: Rank) -> Response:
    return Response(rank.metrics_text(), media_type=CONTENT_TYPE_LATEST)


@public.get("/config")
async def config(rank: Rank) -> dict[str, Any]:
    return rank.config_dict()


@public.get("/v1/state", response_model=RankStateBody)
async def state(rank: Rank) -> RankStateBody:
    return rank.state()


@public.get("/v1/draft_index", response_model=DraftIndexBody)
async def draft_index(rank: Rank) -> DraftIndexBody:
    return await rank.draft_index()


@public.get("/v1/heap", response_model=HeapBody)
async def heap(rank: Rank) -> HeapBody:
    return await rank.heap()


@public.get("/v1/pace", response_model=PaceBody)
async def pace(rank: Rank) -> PaceBody:
    return await rank.pace()


@protected.post("/v1/step_shard")
async def step_shard(body: StepShard, rank: Rank) -> JSONResponse:
    return JSONResponse(await rank.step_shard(body))


@protected.post("/generate")
async def generate(body: GenerateRequest, rank: Rank) -> JSONResponse:
    return JSONResponse(await rank.generate(body))


@protected.post("/v1/score")
async def score(body: ScoreRequest, rank: Rank) -> JSONResponse:
    return JSONResponse(await rank.score(body))


@protected.post("/v1/check_sampling")
async def check_sampling(body: CheckSampling, rank: Rank) -> dict[str, Any]:
    return rank.check_sampling(body)


@protected.post("/v1/tool_calls")
async def tool_calls(body: ParseToolCalls, rank: Rank) -> dict[str, Any]:
    return rank.tool_calls(body)


@protected.post("/v1/abort_step")
async def abort_step(body: AbortStep, rank: Rank) -> dict[str, Any]:
    return rank.abort_step(body)


@protected.post("/v1/weights")
async def weights(body: WeightUpdate, rank: Rank) -> dict[str, Any]:
    return await rank.update_weights(body)


@protected.post("/v1/memory/release")
async def memory_release(body: MemoryTagsIn, rank: Rank) -> dict[str, Any]:
    return await rank.release_memory(body.tags)


@protected.post("/v1/memory/resume")
async def memory_resume(body: MemoryTagsIn, rank: Rank) -> dict[str, Any]:
    return await rank.resume_memory(body.tags)


@protected.post("/v1/weights/group")
async def weights_group(body: WeightGroupOpen, rank: Rank) -> dict[str, Any]:
    return await rank.open_weight_group(body)


@protected.post("/v1/weights/bucket")
async def weights_bucket(body: WeightBucket, rank: Rank) -> dict[str, Any]:
    return await rank.receive_bucket(body)


@protected.post("/v1/weights/tensors")
async def weights_tensors(body: TensorBucket, rank: Rank) -> dict[str, Any]:
    return await rank.receive_tensors(body)


@protected.post("/v1/weights/discard")
async def weights_discard(rank: Rank) -> dict[str, Any]:
    return await rank.discard_push()


@protected.post("/v1/weights/commit")
async def weights_commit(rank: Rank) -> dict[str, Any]:
    return await rank.commit_weights()


@protected.post("/v1/weights/group/close")
async def weights_group_close(body: WeightGroupClose, rank: Rank) -> dict[str, Any]:
    return await rank.close_weight_group(body.group_name)
