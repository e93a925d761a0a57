"""The Python clients against a real gateway (uvicorn on loopback, no ranks behind it)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bubblespec.client import (
    AsyncBubbleSpecClient,
    BubbleSpecClient,
    BubbleSpecError,
    BubbleSpecUnavailable,
    StepReport,
)
from bubblespec.client.client import next_prompts_json, prompt_json, rollout_body, sampling_json
from bubblespec.cluster import free_ports
from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.server import create_app
from bubblespec.protocol.gateway import (
    PromptResult,
    RankShard,
    Rerun,
    RolloutCounters,
    RolloutResponse,
    RolloutSample,
)
from bubblespec.protocol.sampling import SamplingParams
from tests.serving import serve_app

TOKEN = "tok"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    (port,) = free_ports(1)
    (dead,) = free_ports(1)
    cfg = GatewayConfig(port=port, token=TOKEN, sync_address=f"127.0.0.1:{dead}",
                        sync_timeout_s=0.3, probe_timeout_s=0.5)
    with serve_app(create_app(cfg), port=port) as live:
        yield live


def test_errors_carry_status_and_field(url: str) -> None:
    with BubbleSpecClient(url, token=TOKEN) as c:
        with pytest.raises(BubbleSpecError) as e:
            c.rollout([[1, 2, 300]], n=2)
        assert e.value.status == 422 and e.value.field == "prompts[0].input_ids[2]"
        assert "/v1/rollout" in str(e.value)
        with pytest.raises(BubbleSpecError) as e:
            c.rollout([[1, 2]], n=2, sampling_params={"top_p": 2})
        assert e.value.field == "sampling_params.top_p"
        with pytest.raises(BubbleSpecUnavailable) as e:  # valid, but no rank anywhere
            c.rollout(["12 + 7 x 3 ="], n=2)
        assert e.value.status == 503
        with pytest.raises(BubbleSpecUnavailable):
            c.health()
        with pytest.raises(BubbleSpecUnavailable):
            c.step_timeline(3)
        assert c.ranks() == []
    with BubbleSpecClient(url) as c, pytest.raises(BubbleSpecError) as e:
        c.update_weights("/x")
    assert e.value.status == 401 and e.value.field == "authorization"


def test_unreachable_gateway() -> None:
    (port,) = free_ports(1)
    with BubbleSpecClient(f"127.0.0.1:{port}", connect_timeout_s=0.5) as c:
        with pytest.raises(BubbleSpecUnavailable) as e:
            c.ranks()
        assert e.value.status == 0 and "cannot reach" in str(e.value)
        with pytest.raises(BubbleSpecUnavailable):
            c.wait_ready(timeout_s=0.3, period_s=0.1)


def test_async_client(url: str) -> None:
    async def main() -> None:
        async with AsyncBubbleSpecClient(url, token=TOKEN) as c:
            with pytest.raises(BubbleSpecError) as e:
                await c.rollout([{"input_ids": [1, 2]}], n=0)
            assert e.value.field == "n" and e.value.status == 422
            with pytest.raises(BubbleSpecError) as e:
                await c.update_weights("", version=1)
            assert e.value.field == "path"
            assert await c.ranks() == []
            with pytest.raises(BubbleSpecUnavailable):
                await c.wait_ready(timeout_s=0.2, period_s=0.05)

    asyncio.run(main())


@dataclass
class _Prompt:
    input_ids: tuple[int, ...]


def test_request_building() -> None:
    assert prompt_json("1 + 2 x 3 =") == {"text": "1 + 2 x 3 ="}
    assert prompt_json([1, 2]) == {"input_ids": [1, 2]}
    assert prompt_json(_Prompt((1, 4))) == {"input_ids": [1, 4]}
    assert prompt_json({"text": "x"}) == {"text": "x"}
    assert sampling_json(None) == {}
    assert sampling_json(SamplingParams(temperature=0.5))["temperature"] == 0.5
    with pytest.raises(TypeError):
        sampling_json(1.0)
    body = rollout_body([[1]], 3, {"temperature": 1.0}, [[1, 2, 3]], [[2]], 7, None, False,
                        True)
    assert body == {"prompts": [{"input_ids": [1]}], "n": 3,
                    "sampling_params": {"temperature": 1.0}, "return_logprobs": False,
                    "pregen": True, "step": 7, "seeds": [[1, 2, 3]],
                    "next_prompts": [{"input_ids": [2]}]}


def test_next_prompts_take_one_batch_or_a_list_of_the_next_steps_batches() -> None:
    """Every prompt form a trainer holds, as one batch or as several steps' batches."""
    import numpy as np

    one = [{"input_ids": [2, 3]}, {"text": "x"}]
    for batch in ([[2, 3], "x"], [np.array([2, 3]), {"text": "x"}], [_Prompt((2, 3)), "x"]):
        assert next_prompts_json(batch) == one
        assert next_prompts_json([batch, batch]) == [one, one]
    assert next_prompts_json(np.array([[2, 3], [4, 5]])) == [{"input_ids": [2, 3]},
                                                            {"input_ids": [4, 5]}]
    assert next_prompts_json([["a", "b"], ["c"]]) == [[{"text": "a"}, {"text": "b"}],
                                                      [{"text": "c"}]]
    body = rollout_body([[1]], 1, None, None, [[[2]], [[3], [4]]], None,
                        [[[7]], [[8], [9]]], True, True)
    assert body["next_prompts"] == [[{"input_ids": [2]}], [{"input_ids": [3]},
                                                           {"input_ids": [4]}]]
    assert body["next_seeds"] == [[[7]], [[8], [9]]]
    assert rollout_body([[1]], 1, None, None, [[2]], None, [[7]], True,
                        True)["next_seeds"] == [[7]]


def test_results_parse_everything_the_gateway_emits() -> None:
    sample = RolloutSample(sample_index=0, output_ids=[5, 6], output_logprobs=[-0.5, -0.1],
                           finish_reason="stop", weight_version=3, completion_tokens=2,
                           decode_steps=1, num_drafts=1, num_draft_tokens=4,
                           num_accepted_tokens=1)
    resp = RolloutResponse(
        step=4, prompts=[PromptResult(index=0, prompt_key="k", rank_id="r0", input_ids=[1],
                                      samples=[sample])],
        weight_versions=[3], counters=RolloutCounters(completion_tokens=2, tokens_per_forward=2),
        ranks=[RankShard(rank_id="r0", num_prompts=1, num_samples=1, rerun=True)],
        reruns=[Rerun(from_rank="r1", to_rank="r0", indices=[0], reason="gone")],
        wall_s=1.5, warnings=["w"])
    data: dict[str, Any] = resp.model_dump(exclude_none=True)
    res = RolloutResponse.model_validate(data)
    s = res.prompts[0].samples[0]
    assert (s.output_ids, s.output_logprobs, s.finish_reason, s.weight_version,
            s.num_accepted_tokens) == ([5, 6], [-0.5, -0.1], "stop", 3, 1)
    assert res.counters.tokens_per_forward == 2 and res.ranks[0].rerun
    assert res.reruns[0].from_rank == "r1" and res.warnings == ["w"]
    assert res.output_ids() == [[[5, 6]]]
    data["prompts"][0]["samples"][0].pop("output_logprobs")  # return_logprobs=False
    assert RolloutResponse.model_validate(data).prompts[0].samples[0].output_logprobs is None
    rep = StepReport.model_validate({"step": 2, "timeline": None, "rollout": None,
                                "warnings": ["x"]})
    assert rep.wall_s is None and rep.ranks == []
