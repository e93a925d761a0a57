"""`protocol/weights.py`: the bodies of a process-group weight push, refused with the field
named before any rank is called."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bubblespec.protocol.weights import (
    InitWeightsGroupIn,
    TensorBucket,
    WeightBucket,
    WeightGroupOpen,
    WeightsFromDistributedIn,
    WeightsFromTensorIn,
)

SLIME_INIT = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1,
              "world_size": 3, "group_name": "slime-pp_0", "backend": "nccl"}
SLIME_BUCKET = {"names": ["a.weight", "b.bias"], "dtypes": ["bfloat16", "float32"],
                "shapes": [[4, 8], [8]], "group_name": "slime-pp_0", "flush_cache": False,
                "weight_version": "7"}


def test_slimes_bodies_parse() -> None:
    init = InitWeightsGroupIn.model_validate({**SLIME_INIT, "extra_key": 1})
    assert (init.backend, init.world_size, init.group_name) == ("nccl", 3, "slime-pp_0")
    b = WeightsFromDistributedIn.model_validate(SLIME_BUCKET)
    assert b.version() == 7 and b.shapes == [[4, 8], [8]]
    assert WeightsFromDistributedIn.model_validate(
        {**SLIME_BUCKET, "weight_version": None}).version() is None


@pytest.mark.parametrize("bad, field", [
    ({"weight_version": "v7"}, "weight_version"),
    ({"weight_version": "-1"}, "weight_version"),
    ({"names": []}, "names"),
    ({"dtypes": ["float32"]}, None),  # lengths differ
    ({"shapes": [[4, 8], [-1]]}, "shapes"),
    ({"shapes": [[4, 8], [1] * 9]}, "shapes"),
])
def test_bad_buckets_name_the_field(bad: dict, field: str | None) -> None:
    with pytest.raises(ValidationError) as e:
        WeightsFromDistributedIn.model_validate({**SLIME_BUCKET, **bad})
    if field is not None:
        assert e.value.errors()[0]["loc"][0] == field
    else:
        assert "differ in length" in str(e.value)


def test_rank_bodies_forbid_what_they_do_not_know() -> None:
    with pytest.raises(ValidationError):
        WeightGroupOpen.model_validate({**SLIME_INIT, "backend": "gloo"})
    good = {k: v for k, v in SLIME_INIT.items() if k != "backend"}
    assert WeightGroupOpen.model_validate(good).rank_offset == 1
    with pytest.raises(ValidationError, match="outside a group"):
        WeightGroupOpen.model_validate({**good, "rank_offset": 3})
    with pytest.raises(ValidationError):
        WeightBucket.model_validate({"names": ["a"], "dtypes": ["float32"], "shapes": [[1]],
                                     "version": -1})


SGLANG_TENSORS = {"serialized_named_tensors": ["gASVAAAA"], "load_format": "flattened_bucket",
                  "flush_cache": False, "abort_all_requests": False, "weight_version": "8"}


def test_sglangs_update_weights_from_tensor_body_parses() -> None:
    b = WeightsFromTensorIn.model_validate({**SGLANG_TENSORS, "unknown_key": 1})
    assert b.version() == 8 and b.load_format == "flattened_bucket" and not b.flush_cache
    plain = WeightsFromTensorIn.model_validate({"serialized_named_tensors": ["x"]})
    assert plain.load_format is None and plain.version() is None and plain.flush_cache


@pytest.mark.parametrize("bad, field", [
    ({"serialized_named_tensors": []}, "serialized_named_tensors"),
    ({"serialized_named_tensors": ["a", "b"]}, "serialized_named_tensors"),  # TP 2
    ({"serialized_named_tensors": [""]}, "serialized_named_tensors"),
    ({"load_format": "direct"}, "load_format"),
    ({"weight_version": "v8"}, "weight_version"),
])
def test_bad_tensor_bodies_name_the_field(bad: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        WeightsFromTensorIn.model_validate({**SGLANG_TENSORS, **bad})
    assert e.value.errors()[0]["loc"][0] == field
    with pytest.raises(ValidationError):
        TensorBucket.model_validate({"serialized": "x", "version": 1, "extra": 0})
