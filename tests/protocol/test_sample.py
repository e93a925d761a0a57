"""The record of one sampled response (`SampleMeta`) round-trips through every body that
carries it, the rank's answer, the gateway's `RolloutSample` and the SGLang `meta_info`,
with every field as it was, and a step's `RolloutCounters` sum it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bubblespec.protocol.gateway import RankShard, RolloutCounters, RolloutSample
from bubblespec.protocol.rank import PromptOut, SampleOut, StepShardResult
from bubblespec.protocol.sample import SampleMeta, SampleTotals
from bubblespec.protocol.sglang import SglMetaInfo, SglSampleMeta

META = SampleMeta(finish_reason="length", weight_version=7, completion_tokens=5,
                  decode_steps=3, num_drafts=2, num_draft_tokens=6, num_accepted_tokens=2,
                  num_accepted_pregen_tokens=1, first_divergence=4, draft_ran_out=False,
                  num_accepted_after_divergence=1, num_recouplings=2,
                  drafts_off=("logit_bias",))


def test_every_field_is_set_by_the_example() -> None:
    """The example below differs from the defaults in every field, so the round trips
    would notice a field that is lost on the way."""
    default = SampleMeta()
    assert all(getattr(META, k) != getattr(default, k) for k in SampleMeta.model_fields)


def test_json_round_trip_and_immutability() -> None:
    assert SampleMeta.model_validate_json(META.model_dump_json()) == META
    with pytest.raises(ValidationError):
        META.num_drafts = 0  # type: ignore[misc]


def test_a_newer_ranks_keys_are_ignored() -> None:
    data = {**META.model_dump(), "num_brand_new": 3}
    assert SampleMeta.model_validate(data) == META


def test_the_rank_answer_carries_it_unchanged() -> None:
    out = SampleOut(sample_index=1, output_ids=[1, 2, 3, 4, 5], output_logprobs=[-0.1] * 5,
                    meta_info=META)
    reply = StepShardResult(step=2, rank_id="r0", results=[
        PromptOut(index=0, prompt_key="k", samples=[out])])
    again = StepShardResult.model_validate_json(reply.model_dump_json())
    assert again.results[0].samples[0].meta_info == META
    assert set(reply.model_dump()["results"][0]["samples"][0]["meta_info"]) == \
        set(SampleMeta.model_fields)


def test_the_gateway_sample_is_the_record_plus_tokens() -> None:
    s = RolloutSample.of(META, 1, [1, 2, 3, 4, 5], None)
    assert s.meta == META and s.sample_index == 1 and s.output_logprobs is None
    assert RolloutSample.model_validate_json(s.model_dump_json()) == s
    # the gateway's JSON keys are the record's keys, flat, beside the tokens
    assert set(s.model_dump()) == set(SampleMeta.model_fields) | {
        "sample_index", "output_ids", "output_logprobs", "output_top_logprobs"}


def test_the_sglang_meta_info_carries_it_under_bubblespec() -> None:
    info = SglMetaInfo(id="r1", finish_reason={"type": "length", "length": 5},
                       prompt_tokens=3, completion_tokens=5,
                       bubblespec=SglSampleMeta(step=9, **dict(META)))
    data = info.model_dump(mode="json", exclude_unset=True)
    assert data["bubblespec"] == {"step": 9, **META.model_dump(mode="json")}
    assert SampleMeta.model_validate(data["bubblespec"]) == META
    assert "output_token_logprobs" not in data


def test_a_step_sums_its_samples() -> None:
    other = SampleMeta(finish_reason="stop", completion_tokens=2, decode_steps=2,
                       first_divergence=0, draft_ran_out=True, num_recouplings=1)
    totals = SampleTotals.sums([META, other])
    assert totals == {"completion_tokens": 7, "request_decode_steps": 5, "num_drafts": 2,
                      "num_draft_tokens": 6, "num_accepted_tokens": 2,
                      "num_accepted_pregen_tokens": 1, "responses_diverged": 2,
                      "responses_draft_ran_out": 1, "num_accepted_after_divergence": 1,
                      "num_recouplings": 3, "responses_undrafted": 1}
    assert set(totals) == set(SampleTotals.model_fields)
    samples = [RolloutSample.of(m, i, [1], None) for i, m in enumerate([META, other])]
    k = RolloutCounters.of(samples, [RankShard(rank_id="r0", decode_steps=3)])
    assert k.model_dump(include=set(SampleTotals.model_fields)) == totals
