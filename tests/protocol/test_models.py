"""Rank and gateway bodies round-trip through JSON, replies tolerate newer gateways, and the
client hands back these very models (no copies)."""

from __future__ import annotations

from bubblespec import client
from bubblespec.client.client import rollout_body, sampling_json
from bubblespec.protocol import gateway
from bubblespec.protocol.gateway import (
    PromptResult,
    RolloutRequest,
    RolloutResponse,
    RolloutSample,
    StepReport,
)
from bubblespec.protocol.rank import RankStateBody, ShardRequest, StepShard
from bubblespec.protocol.sampling import PregenWindow, SamplingParams


def test_step_shard_round_trip() -> None:
    shard = StepShard(step=3, requests=[ShardRequest(
        index=1, input_ids=[1, 2], n=2, sample_offset=4, seeds=[7, 8], prompt_key="k",
        sampling_params=SamplingParams(temperature=0.5, seed_mode="keyed"))])
    again = StepShard.model_validate_json(shard.model_dump_json())
    assert again == shard and again.requests[0].sampling_params.seed_mode == "keyed"


def test_rollout_request_round_trip_with_enums() -> None:
    req = RolloutRequest(prompts=[{"input_ids": [1]}, {"text": "1 + 2 ="}], n=4,
                         sampling_params=SamplingParams(top_k=0, max_new_tokens=9),
                         next_prompts=[{"input_ids": [3]}], pregen_window="training")
    data = req.model_dump(mode="json", exclude_none=True)
    assert data["pregen_window"] == "training" and data["sampling_params"]["top_k"] == -1
    assert RolloutRequest.model_validate(data) == req


def test_replies_ignore_fields_a_newer_gateway_adds() -> None:
    sample = {"sample_index": 0, "output_ids": [5], "brand_new": 1}
    resp = RolloutResponse.model_validate({"step": 1, "prompts": [
        {"index": 0, "prompt_key": "k", "rank_id": "r0", "input_ids": [1], "samples": [sample]}],
        "future_counter": 3})
    assert resp.prompts[0].samples[0] == RolloutSample(sample_index=0, output_ids=[5])
    assert resp.output_ids() == [[[5]]] and resp.wall_s == 0.0
    assert isinstance(resp.prompts[0], PromptResult)


def test_step_report_lifts_the_timeline() -> None:
    timeline = {"wall_s": 2.0, "complete": True, "bubble_fraction": 0.25, "pregen_share": 0.5,
                "pregen_tokens": 40, "window_pregen_tokens": 4, "stop_lag_s": 0.01,
                "ranks": [{"rank_id": "r0", "bubble_s": 0.5, "spans": 3}]}
    rep = StepReport.model_validate({"step": 5, "timeline": timeline, "rollout": {"n": 1}})
    assert (rep.wall_s, rep.complete, rep.bubble_fraction, rep.pregen_tokens) == (2.0, True,
                                                                                 0.25, 40)
    assert rep.ranks[0].bubble_s == 0.5 and rep.stop_lag_s == 0.01
    assert rep.window_pregen_tokens == 4
    assert StepReport.model_validate(rep.model_dump()) == rep
    empty = StepReport.model_validate({"step": 2, "timeline": None, "rollout": None})
    assert empty.wall_s is None and empty.ranks == [] and not empty.complete


def test_rank_state_body_is_not_the_heartbeat_enum() -> None:
    body = RankStateBody(rank_id="r0", state="idle", weight_version=2)
    assert RankStateBody.model_validate_json(body.model_dump_json()) == body


def test_client_reuses_the_protocol_models() -> None:
    for name in ("PromptResult", "RankBubble", "RankEntry", "RankShard", "Rerun",
                 "RolloutCounters", "RolloutResponse", "RolloutSample", "StepReport",
                 "WeightsResult"):
        assert getattr(client, name) is getattr(gateway, name)
    assert client.SamplingParams is SamplingParams and client.PregenWindow is PregenWindow
    sp = SamplingParams(stop_token_ids=[2], seed_mode="keyed")
    # only the fields the caller set travel, so an unset seed_mode stays the gateway's choice
    assert sampling_json(sp) == {"stop_token_ids": [2], "seed_mode": "keyed"}
    assert SamplingParams.model_validate(sampling_json(sp)) == sp
    assert "seed_mode" not in sampling_json(SamplingParams(temperature=0.5))
    body = rollout_body([[1]], 2, sp, None, None, None, None, True, True,
                        PregenWindow.TRAINING)
    assert body["pregen_window"] == "training"
    assert RolloutRequest.model_validate(body).sampling_params == sp


def test_rollout_counters_sum_samples_and_ranks() -> None:
    from bubblespec.protocol.gateway import RankShard, RolloutCounters, RolloutSample

    samples = [RolloutSample(sample_index=0, output_ids=[1, 2, 3], completion_tokens=3,
                             decode_steps=2, num_drafts=1, num_draft_tokens=4,
                             num_accepted_tokens=1, num_accepted_pregen_tokens=1,
                             first_divergence=2, draft_ran_out=True,
                             num_accepted_after_divergence=1, num_recouplings=1),
               RolloutSample(sample_index=1, output_ids=[4], completion_tokens=1,
                             decode_steps=1)]
    ranks = [RankShard(rank_id="r0", decode_steps=2, drafts_fetched_tokens=7),
             RankShard(rank_id="r1", decode_steps=1)]
    k = RolloutCounters.of(samples, ranks)
    assert (k.completion_tokens, k.decode_steps_critical, k.decode_steps_total,
            k.request_decode_steps) == (4, 2, 3, 3)
    assert (k.num_accepted_pregen_tokens, k.drafts_fetched_tokens) == (1, 7)
    assert (k.responses_diverged, k.num_accepted_after_divergence, k.num_recouplings) == (1, 1, 1)
    assert k.responses_draft_ran_out == 1
    assert k.tokens_per_forward == 4 / 3
    assert RolloutCounters.of([], []).tokens_per_forward == 0.0
