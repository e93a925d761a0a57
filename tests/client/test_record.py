"""The rollout record (`bubblespec.client.record`) without a cluster: digests, the record
line of a gateway answer, the gateway's seed rule re-derived, finding a step, the replay body
and the comparison. The real round trip (record on a cluster, replay, compare) is
tests/integration/test_replay.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bubblespec.client.record import (
    Recorder,
    RecordError,
    compare,
    derived_seeds,
    find_record,
    ids_digest,
    logprobs_digest,
    read_records,
    replay_body,
    step_record,
)
from bubblespec.gateway.seeds import assign_keys, step_seeds
from bubblespec.protocol.gateway import RolloutResponse


def _response(step: int, ids: list[list[int]], lps: list[list[float]] | None) -> RolloutResponse:
    prompts = [[1, 5, 9], [1, 5, 9], [1, 7]]
    keys = assign_keys(prompts)
    return RolloutResponse.model_validate({
        "step": step, "seed_mode": "keyed", "weight_versions": [2],
        "prompts": [{"index": i, "prompt_key": keys[i], "rank_id": f"r{i % 2}",
                     "input_ids": p,
                     "samples": [{"sample_index": 0, "output_ids": ids[i], "weight_version": 2,
                                  "output_logprobs": None if lps is None else lps[i]}]}
                    for i, p in enumerate(prompts)]})


IDS = [[3, 4], [5], [6, 7, 8]]
LPS = [[-0.5, -1.25], [-2.0], [-0.1, -0.2, -0.30000001192092896]]


def test_digests_are_exact() -> None:
    assert ids_digest([1, 2]) != ids_digest([12])
    assert logprobs_digest([-0.1]) != logprobs_digest([-0.1 + 2 ** -55])
    assert logprobs_digest(None) is None
    # a float survives JSON exactly, so a digest of the parsed answer is the rank's
    x = [-0.30000001192092896, -1e-30]
    assert logprobs_digest(json.loads(json.dumps(x))) == logprobs_digest(x)


def test_derived_seeds_are_the_gateways() -> None:
    """The recorder's seeds for a step without caller seeds equal the gateway's own rule."""
    res = _response(9, IDS, LPS)
    prompts = [p.input_ids for p in res.prompts]
    assert derived_seeds(123, res, 4) == step_seeds(123, 9, assign_keys(prompts), 4)


def test_record_find_replay_compare(tmp_path: Path) -> None:
    path = tmp_path / "r" / "steps.jsonl"
    rec = Recorder(path)
    body = {"prompts": [{"input_ids": [1, 5, 9]}] * 2 + [{"text": "x"}], "n": 1,
            "sampling_params": {"temperature": 1.0}}
    for step in (4, 5, 4):  # step 4 twice (a restarted gateway): the last one counts
        res = _response(step, IDS, LPS)
        rec.write(step_record(res, body, derived_seeds(0, res, 1), "gateway", "http://gw"))
    line = find_record(path, 4)
    assert line == list(read_records(path))[2]
    b = replay_body(line)
    assert b["prompts"][2] == {"input_ids": [1, 7]}  # text prompts replay as their ids
    assert b["sampling_params"]["seed_mode"] == "keyed" and b["pregen"] is False
    assert b["seeds"] == derived_seeds(0, _response(4, IDS, LPS), 1)

    same = compare(line, _response(11, IDS, LPS))
    assert same.ok and same.mismatches == 0 and "3/3 samples match" in same.summary()
    lp = [list(x) for x in LPS]
    lp[2][1] = -0.2000000001
    other = compare(line, _response(11, [[3, 4], [5, 2], [6, 7, 8]], lp))
    assert [s.match for s in other.samples] == [True, False, False]
    assert "ids differ (1 -> 2 tokens)" in other.samples[1].line()
    assert "log-probs differ (ids equal)" in other.samples[2].line()
    no_lp = compare(line, _response(11, IDS, None))
    assert not no_lp.ok  # the record has log-probs, the replay none: not a match

    with pytest.raises(RecordError, match="no record of step 7"):
        find_record(path, 7)


def test_unreplayable_and_bad_files(tmp_path: Path) -> None:
    res = _response(1, IDS, None)
    line = step_record(res, {"n": 1}, None, "unknown", "http://gw")
    with pytest.raises(RecordError, match="cannot be replayed"):
        replay_body(line)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "other"}\n')
    with pytest.raises(RecordError, match="bad.jsonl:1"):
        find_record(bad, None)
    with pytest.raises(RecordError, match="no record file"):
        find_record(tmp_path / "none.jsonl", 1)
