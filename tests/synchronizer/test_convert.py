"""The protobuf boundary: pre-generation tasks and drafts survive the wire unchanged, and an
unset sampling field reads as the protocol's default."""

from __future__ import annotations

import struct
from array import array

import pytest

from bubblespec.protocol.domain import PregenDraft, PregenTask
from bubblespec.protocol.sampling import SamplingParams, SeedMode
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.synchronizer import convert as cv

FULL = SamplingParams(max_new_tokens=33, temperature=0.7, top_p=0.9, top_k=20,
                      stop_token_ids=[2, 9], ignore_eos=True, seed_mode="keyed",
                      repetition_penalty=1.3, presence_penalty=-0.5, frequency_penalty=1.5,
                      min_tokens=4, min_p=0.05, logit_bias={7: -100.0, 3: 2.5})


def test_task_round_trip_keeps_every_sampling_field() -> None:
    t = PregenTask("p0", [1, 2, 3], 4, seed=2**63 - 1, sampling=FULL)
    back = cv.task_from_pb(cv.task_to_pb(t))
    assert back == t and back.max_new_tokens == 33
    assert back.sampling.seed_mode is SeedMode.KEYED and back.sampling.repetition_penalty == 1.3
    assert (back.sampling.presence_penalty, back.sampling.frequency_penalty,
            back.sampling.min_tokens) == (-0.5, 1.5, 4)
    assert (back.sampling.min_p, back.sampling.logit_bias) == (0.05, ((3, 2.5), (7, -100.0)))


def test_prompts_carry_tokens_once_and_flatten_back() -> None:
    tasks = [PregenTask(f"p{p}", [1, p + 2], s, seed=10 * p + s, sampling=FULL)
             for p in range(2) for s in range(3)]
    prompts = cv.tasks_to_prompts(tasks)
    assert [len(p.samples) for p in prompts] == [3, 3] and prompts[0].max_new_tokens == 33
    back = cv.prompts_to_tasks(prompts, 6)
    assert [(t.prompt_key, list(t.prompt_token_ids), t.sample_index, t.seed, t.sampling)
            for t in back] == [(t.prompt_key, t.prompt_token_ids, t.sample_index, t.seed,
                                t.sampling) for t in tasks]
    assert {t.step for t in back} == {7}  # unnamed: the step after the opened one


def test_tasks_of_several_future_steps_travel_per_step() -> None:
    """One prompt handed for two future steps travels once per step and flattens back with
    each task's step; a claimed task keeps its step and refresh hint on the wire."""
    tasks = [PregenTask("p", [1, 2], s, seed=s, sampling=FULL, step=step)
             for step in (4, 5) for s in range(2)]
    prompts = cv.tasks_to_prompts(tasks)
    assert [(p.step, len(p.samples)) for p in prompts] == [(4, 2), (5, 2)]
    back = cv.prompts_to_tasks(prompts, 3)
    assert [(t.step, t.sample_index) for t in back] == [(4, 0), (4, 1), (5, 0), (5, 1)]
    t = PregenTask("p", [1], 0, 9, FULL, step=5, hint=[3, 4, 5])
    back1 = cv.task_from_pb(cv.task_to_pb(t))
    assert back1.step == 5 and list(back1.hint) == [3, 4, 5]


def test_tasks_of_one_prompt_must_agree_on_sampling() -> None:
    a = PregenTask("p", [1], 0, 1, FULL)
    b = PregenTask("p", [1], 1, 2, FULL.model_copy(update={"max_new_tokens": 34}))
    with pytest.raises(ValueError, match="tasks\\[1\\]"):
        cv.tasks_to_prompts([a, b])


def test_unset_sampling_fields_are_the_protocol_defaults() -> None:
    assert cv.sampling_from_pb(pb.SamplingParams(), 128) == SamplingParams()
    assert cv.sampling_from_pb(pb.SamplingParams(top_k=0), 5).top_k == -1


def test_draft_round_trip() -> None:
    """Tokens travel packed (int32 little-endian) and come back as `array('i')`; a message
    with the repeated field (another client's) reads the same."""
    d = PregenDraft("p", 2, array("i", [5, 6, 2**31 - 1]), complete=True, weight_version=3,
                    offset=1)
    m = cv.draft_to_pb(d)
    assert m.token_ids_packed == struct.pack("<3i", 5, 6, 2**31 - 1) and not m.token_ids
    assert cv.draft_from_pb(m) == d
    assert cv.draft_from_pb(pb.Draft(prompt_key="p", sample_index=2, token_ids=[5, 6])) == \
        PregenDraft("p", 2, array("i", [5, 6]))
    for at in (0, 1):  # a branch at position 0 is not the draft itself
        b = PregenDraft("p", 2, array("i", [5, 6]), branch_at=at)
        assert cv.draft_from_pb(cv.draft_to_pb(b)) == b
    assert cv.draft_from_pb(cv.draft_to_pb(PregenDraft("p", 0, [7, 8]))).token_ids.tolist() \
        == [7, 8]
    assert not cv.draft_to_pb(d).HasField("branch_at")
    o = PregenDraft("p", 2, [5, 6, 7], complete=True, branch_offers=[(2, 9), (0, 4)])
    assert cv.draft_from_pb(cv.draft_to_pb(o), lists=True) == o


def test_branch_task_round_trip() -> None:
    t = PregenTask("p", [1, 2], 3, 11)
    assert cv.task_from_pb(cv.task_to_pb(t)) == t
    assert not cv.task_to_pb(t).HasField("branch_at")
    for at in (0, 4):  # a branch at 0 has a one-token prefix: the runner-up alone
        b = PregenTask("p", [1, 2], 3, 11, prefix=[5, 6, 7, 8, 9][:at] + [3], branch_at=at)
        assert cv.task_from_pb(cv.task_to_pb(b)) == b
