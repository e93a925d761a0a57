"""Bad requests get InvalidRequest naming the field (no engine needed)."""

from __future__ import annotations

import pytest

from bubblespec.engine import GenRequest, InvalidRequest, SamplingSpec
from bubblespec.engine.validate import validate_request

VOCAB, MAX_LEN = 100, 1000


@pytest.mark.parametrize("req,field", [
    (GenRequest(input_ids=[]), "input_ids"),
    (GenRequest(input_ids=[1, 100]), "input_ids[1]"),
    (GenRequest(input_ids=[1, -1]), "input_ids[1]"),
    (GenRequest(input_ids=[1], n=0), "n"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(max_new_tokens=1000)),
     "sampling_params.max_new_tokens"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(max_new_tokens=0)),
     "sampling_params.max_new_tokens"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(temperature=-0.5)),
     "sampling_params.temperature"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(temperature=float("nan"))),
     "sampling_params.temperature"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(top_p=0.0)), "sampling_params.top_p"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(top_k=0)), "sampling_params.top_k"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(stop_token_ids=[500])),
     "sampling_params.stop_token_ids[0]"),
    (GenRequest(input_ids=[1], n=2, seeds=[1]), "seeds"),
    (GenRequest(input_ids=[1], seeds=[-3]), "seeds[0]"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(seed_mode="magic")),
     "sampling_params.seed_mode"),
    (GenRequest(input_ids=[1], sampling=SamplingSpec(seed_mode="keyed")), "seeds"),
])
def test_bad_field_named(req: GenRequest, field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        validate_request(req, VOCAB, MAX_LEN)
    assert e.value.field == field


def test_good_request_passes() -> None:
    validate_request(GenRequest(input_ids=[1, 2], n=3, seeds=[1, 2, 3],
                                sampling=SamplingSpec(max_new_tokens=10, seed_mode="keyed")),
                     VOCAB, MAX_LEN)
