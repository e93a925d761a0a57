"""Bad requests get InvalidRequest naming the field (no engine needed).

Ranges of the sampling parameters themselves are the protocol model's to check
(tests/protocol/test_sampling.py); here are the checks that depend on the engine."""

from __future__ import annotations

import pytest

from bubblespec.engine import GenRequest
from bubblespec.engine.validate import validate_request
from bubblespec.protocol.errors import InvalidRequest
from bubblespec.protocol.sampling import SamplingParams

VOCAB, MAX_LEN = 100, 1000


@pytest.mark.parametrize("req,field", [
    (GenRequest(input_ids=[]), "input_ids"),
    (GenRequest(input_ids=[1, 100]), "input_ids[1]"),
    (GenRequest(input_ids=[1, -1]), "input_ids[1]"),
    (GenRequest(input_ids=[1], n=0), "n"),
    (GenRequest(input_ids=[1], sampling=SamplingParams(max_new_tokens=1000)),
     "sampling_params.max_new_tokens"),
    (GenRequest(input_ids=[1], sampling=SamplingParams(stop_token_ids=[500])),
     "sampling_params.stop_token_ids[0]"),
    (GenRequest(input_ids=[1], n=2, seeds=[1]), "seeds"),
    (GenRequest(input_ids=[1], seeds=[-3]), "seeds[0]"),
    (GenRequest(input_ids=[1], sampling=SamplingParams(seed_mode="keyed")), "seeds"),
])
def test_bad_field_named(req: GenRequest, field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        validate_request(req, VOCAB, MAX_LEN)
    assert e.value.field == field


def test_good_request_passes() -> None:
    validate_request(GenRequest(input_ids=[1, 2], n=3, seeds=[1, 2, 3],
                                sampling=SamplingParams(max_new_tokens=10, seed_mode="keyed")),
                     VOCAB, MAX_LEN)
