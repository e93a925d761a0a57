"""The SGLang-compatible routes on the gateway, without ranks: SGLang's error shape with the
field named (400, never a 5xx for bad input), hostile bodies, the bearer token, and the
control and info routes that answer without an engine.

Bodies and routes are those slime (`slime/rollout/sglang_rollout.py`,
`slime/backends/sglang_utils/sglang_engine.py`) and AReaL (`areal/engine/sglang_remote.py`)
call. The gateway runs in-process with no synchronizer and no rank, so a valid /generate
ends in SGLang's error body with 503 "no rank is ready"; the end-to-end path with real
ranks is tests/integration/api/test_sglang_clients.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from bubblespec.protocol.sglang import GenerateIn, WeightsFromDiskIn
from tests.gateway.helpers import gateway
from tests.hostile.bodies import dumps, mutated, schema_paths

TOKEN = "sgl-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
GEN = {"input_ids": [1, 5, 6], "return_logprob": True,
       "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "stop_token_ids": [2]}}


@pytest.fixture(scope="module")
def gw() -> Iterator[TestClient]:
    with gateway(max_prompts=256, max_prompt_tokens=64, max_new_tokens=1000, max_body_bytes=64 * 1024,
                 max_n=64, sglang_quiet_s=0.005, sglang_max_wait_s=0.05) as c:
        yield c


@pytest.fixture(scope="module")
def gw_token() -> Iterator[TestClient]:
    with gateway(token=TOKEN, sglang_quiet_s=0.005) as c:
        yield c


def sgl_error(r: Any, status: int, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["message"] and body["detail"] == body["error"]["message"]
    if field is not None:
        assert body["field"] == field == body["error"]["field"], body
    return body


@pytest.mark.parametrize(("body", "field"), [
    ({}, "body"),
    ({**GEN, "text": "1 2"}, "body"),
    ({**GEN, "input_ids": []}, "input_ids"),
    ({**GEN, "input_ids": [1, 10**6]}, "input_ids"),
    ({**GEN, "input_ids": [1, 99999]}, "input_ids"),
    ({**GEN, "input_ids": [1] * 65}, "input_ids"),
    ({**GEN, "stream": True}, "stream"),
    ({**GEN, "bogus": 1}, "bogus"),
    ({**GEN, "sampling_params": {"min_p": 2}}, "sampling_params.min_p"),
    ({**GEN, "sampling_params": {"frequency_penalty": 2.3}},
     "sampling_params.frequency_penalty"),
    ({**GEN, "sampling_params": {"presence_penalty": -2.3}}, "sampling_params.presence_penalty"),
    ({**GEN, "sampling_params": {"stop": ["\n"]}}, "sampling_params.stop"),
    ({**GEN, "sampling_params": {"max_new_tokens": 1001}}, "sampling_params.max_new_tokens"),
    ({**GEN, "sampling_params": {"n": 65}}, "sampling_params.n"),
    ({**GEN, "input_ids": [[1]] * 5, "sampling_params": {"n": 64}}, "input_ids"),
    ({**GEN, "sampling_params": {"stop_token_ids": [99999]}},
     "sampling_params.stop_token_ids[0]"),
    ({**GEN, "next_input_ids": [[1, 99999]]}, "next_input_ids"),
])
def test_generate_refusals_are_400_naming_the_field(gw: TestClient, body: dict[str, Any],
                                                    field: str) -> None:
    sgl_error(gw.post("/generate", json=body), 400, field)


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"null", b"", b"\xff"])
def test_malformed_json_is_400(gw: TestClient, raw: bytes) -> None:
    r = gw.post("/generate", content=raw, headers={"content-type": "application/json"})
    sgl_error(r, 400, "body")


def test_valid_generate_without_ranks_is_503(gw: TestClient) -> None:
    body = sgl_error(gw.post("/generate", json=GEN), 503)
    assert "no rank is ready" in body["error"]["message"]
    batch = {**GEN, "input_ids": [[1, 5], [1, 6]], "sampling_params": {"n": 2}}
    sgl_error(gw.post("/generate", json=batch), 503)


def test_weight_update_refusals_and_no_ranks(gw: TestClient) -> None:
    r = gw.post("/update_weights_from_disk", json={"model_path": "/x", "weight_version": "v2"})
    assert r.status_code == 400 and r.json()["success"] is False
    assert r.json()["field"] == "weight_version"
    r = gw.post("/update_weights_from_disk", json={"model_path": ""})
    assert r.status_code == 400 and r.json()["field"] == "model_path"
    r = gw.post("/update_weights_from_disk",
                json={"model_path": "/nonexistent", "abort_all_request": True})
    assert r.status_code == 503 and r.json()["success"] is False


def test_control_routes(gw: TestClient) -> None:
    assert gw.post("/pause_generation").json()["success"]
    assert gw.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
    sgl_error(gw.post("/pause_generation", json={"mode": "later"}), 400, "mode")
    assert gw.get("/v1/loads").json()["paused"] is True
    assert gw.post("/continue_generation").json()["success"]
    assert gw.get("/v1/loads").json()["paused"] is False
    assert gw.post("/abort_request", json={"rid": "nope"}).json()["aborted_queued"] == 0
    assert gw.post("/abort_request", json={"abort_all": True}).json()["success"]
    sgl_error(gw.post("/abort_request", json={}), 400, "body")
    assert gw.post("/flush_cache").text.startswith("Cache flushed")
    assert gw.get("/flush_cache").status_code == 200
    r = gw.post("/v1/next_prompts", json={"input_ids": [[1, 5], [1, 5], [1, 6]]})
    assert r.json() == {"success": True, "next_prompts": 2, "next_batches": [2],
                        "pregen_window": None}
    assert gw.get("/v1/loads").json()["next_prompts"] == 2
    # the next steps' batches: merged per step with what is waiting; the window is kept
    r = gw.post("/v1/next_prompts", json={"input_ids": [[[1, 6], [1, 7]], [[1, 8]]],
                                          "pregen_window": "training"})
    assert r.json() == {"success": True, "next_prompts": 3, "next_batches": [3, 1],
                        "pregen_window": "training"}
    r = gw.post("/v1/next_prompts", json={"input_ids": [[1, 9]]})
    assert r.json()["pregen_window"] == "training"
    sgl_error(gw.post("/v1/next_prompts", json={"input_ids": [[1]], "pregen_window": "later"}),
              400, "pregen_window")
    r = gw.post("/v1/next_prompts", json={"pregen_window": "bubble"})  # the window alone
    assert r.json() == {"success": True, "next_prompts": 4, "next_batches": [4, 1],
                        "pregen_window": "bubble"}
    sgl_error(gw.post("/v1/next_prompts", json={}), 400, "body")
    sgl_error(gw.post("/v1/next_prompts", json={"input_ids": []}), 400, "input_ids")
    sgl_error(gw.post("/v1/next_prompts", json={"input_ids": [[[1], []]]}), 400, "input_ids")


def test_info_routes(gw: TestClient) -> None:
    assert gw.get("/get_weight_version").json() == {"weight_version": "0"}
    info = gw.get("/get_model_info").json()
    assert info["is_generation"] is True and info["weight_version"] == "0"
    for route in ("/get_server_info", "/server_info"):
        s = gw.get(route).json()
        assert s["version"].startswith("bubblespec") and s["dp_size"] == 0
        assert s["internal_states"][0]["num_waiting_reqs"] == 0
    assert gw.get("/health").status_code == 200
    assert gw.get("/health_generate").status_code == 503


def test_bearer_token(gw_token: TestClient) -> None:
    for route in ("/generate", "/update_weights_from_disk", "/abort_request",
                  "/pause_generation", "/continue_generation", "/flush_cache",
                  "/v1/next_prompts", "/init_weights_update_group",
                  "/update_weights_from_distributed", "/destroy_weights_update_group",
                  "/update_weights_from_tensor", "/v1/weights/commit"):
        r = gw_token.post(route, json=GEN)
        assert r.status_code == 401 and r.json()["field"] == "authorization", route
    r = gw_token.post("/generate", json={**GEN, "stream": True}, headers=AUTH)
    assert r.status_code == 400
    for route in ("/get_model_info", "/get_server_info", "/get_weight_version", "/v1/loads"):
        assert gw_token.get(route).status_code == 200, route


def _paths(model: Any) -> list[tuple[str | int, ...]]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    doc = {"components": {"schemas": schema.get("$defs", {})}}
    return sorted(set(schema_paths(doc, schema)), key=lambda p: (len(p), str(p)))


HYPO = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize(("route", "model", "base"), [
    ("/generate", GenerateIn, {**GEN, "next_input_ids": [[1, 7]], "rid": "a"}),
    ("/update_weights_from_disk", WeightsFromDiskIn, {"model_path": "/x",
                                                      "weight_version": "3"}),
])
def test_hostile_bodies_never_get_a_5xx(gw: TestClient, route: str, model: Any,
                                        base: dict[str, Any]) -> None:
    @given(mutated(base, _paths(model)))
    @HYPO
    def run(case: tuple[str, Any]) -> None:
        what, body = case
        r = gw.post(route, content=dumps(body), headers={"content-type": "application/json"})
        detail = json.loads(r.content).get("detail", "")
        if r.status_code == 503:  # a valid body: no rank to run it on
            assert "no rank" in detail, f"{route}: {what}: {r.text}"
        else:
            assert 400 <= r.status_code < 500, f"{route}: {what}: {r.status_code} {r.text}"
            assert "field" in r.json()

    run()


async def test_answer_shape(gw: TestClient) -> None:
    """One sample as SGLang answers it: matched stop token, text with and without the stop
    token, [logprob, id, text] triples, length and abort reasons (slime reads `text` and the
    triples; AReaL reads `finish_reason.type` and `message`)."""
    from bubblespec.batching import ABORT_BEFORE_PREFILL, Answer, Ask
    from bubblespec.protocol.gateway import RolloutSample
    from bubblespec.tasks import default_task

    task = default_task()
    front = gw.app.state.sglang
    ids = task.encode("1 2 ; 3")
    body = GenerateIn.model_validate({**GEN, "rid": "r7"})
    ask = Ask([1, 5, 6], body.sampling_params.to_sampling(), None, "r7")
    stop = RolloutSample(sample_index=0, output_ids=[*ids, task.eos_id],
                         output_logprobs=[-0.25] * (len(ids) + 1), finish_reason="stop",
                         weight_version=4, decode_steps=2, num_accepted_tokens=3)
    out = front.out(body, ask, Answer(stop, [1, 5, 6], step=9), 0.0)
    meta = out["meta_info"]
    assert out["text"] == "1 2 ; 3" and out["output_ids"] == [*ids, task.eos_id]
    assert meta["finish_reason"] == {"type": "stop", "matched": task.eos_id}
    assert meta["output_token_logprobs"] == [[-0.25, t, None] for t in out["output_ids"]]
    assert (meta["id"], meta["prompt_tokens"], meta["completion_tokens"]) == ("r7", 3, 5)
    assert meta["weight_version"] == "4" and meta["bubblespec"]["step"] == 9
    keep = GenerateIn.model_validate({**GEN, "return_text_in_logprobs": True,
                                      "sampling_params": {"no_stop_trim": True,
                                                          "skip_special_tokens": False}})
    out = front.out(keep, ask, Answer(stop, [1, 5, 6]), 0.0)
    assert out["text"].endswith("<eos>") and out["meta_info"]["output_token_logprobs"][0][2]
    length = stop.model_copy(update={"finish_reason": "length"})
    assert front.out(body, ask, Answer(length, [1]), 0.0)["meta_info"]["finish_reason"] == \
        {"type": "length", "length": 5}
    gone = front.out(body, ask, Answer(None, [1, 5, 6], message=ABORT_BEFORE_PREFILL), 0.0)
    assert gone["output_ids"] == [] and gone["meta_info"]["output_token_logprobs"] == []
    assert gone["meta_info"]["finish_reason"] == {"type": "abort",
                                                  "message": ABORT_BEFORE_PREFILL}


def test_weight_group_routes_refuse_before_calling_a_rank(gw: TestClient) -> None:
    init = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
            "world_size": 3, "group_name": "g", "backend": "gloo"}

    def refused(r: Any, status: int, field: str) -> None:
        assert r.status_code == status, r.text
        body = r.json()
        assert body["success"] is False and body["field"] == field and body["message"], body

    refused(gw.post("/init_weights_update_group", json={**init, "backend": "nccl"}), 400,
            "backend")
    refused(gw.post("/init_weights_update_group", json={**init, "world_size": 0}), 400,
            "world_size")
    r = gw.post("/init_weights_update_group", json=init)  # no rank to join
    assert r.status_code == 503 and r.json()["success"] is False
    bucket = {"names": ["a"], "dtypes": ["float32"], "shapes": [[2]], "group_name": "g"}
    refused(gw.post("/update_weights_from_distributed", json=bucket), 404, "group_name")
    refused(gw.post("/update_weights_from_distributed",
                    json={**bucket, "weight_version": "x"}), 400, "weight_version")
    refused(gw.post("/destroy_weights_update_group", json={"group_name": "g"}), 404,
            "group_name")
    refused(gw.post("/v1/weights/commit", json={"group_name": "g"}), 404, "group_name")
    refused(gw.post("/v1/weights/commit", json={}), 409, "weight_version")
    tensors = {"serialized_named_tensors": ["gASVAAAA"], "load_format": "flattened_bucket"}
    refused(gw.post("/update_weights_from_tensor", json={**tensors, "load_format": "direct"}),
            400, "load_format")
    refused(gw.post("/update_weights_from_tensor",
                    json={**tensors, "serialized_named_tensors": ["a", "b"]}), 400,
            "serialized_named_tensors")
    r = gw.post("/update_weights_from_tensor", json=tensors)  # no rank to take them
    assert r.status_code == 503 and r.json()["success"] is False
    # nothing staged: the end of a pause just resumes
    assert gw.post("/continue_generation").json() == {"success": True,
                                                      "message": "Generation continued."}
