"""`client/weights.py`: how a push is cut into buckets, and a refusal as the trainer sees it
(the push itself runs against real ranks in tests/integration/test_weight_group.py)."""

from __future__ import annotations

import httpx
import pytest
import torch

from bubblespec.client.weights import WeightPushError, _answer, buckets


def test_buckets_keep_order_and_size_and_put_a_large_tensor_alone() -> None:
    named = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in
             enumerate([100, 100, 600, 50, 50, 50])]  # 400, 400, 2400, 200, 200, 200 bytes
    cut = list(buckets(named, max_bytes=800))
    assert [[n for n, _ in b] for b in cut] == [["t0", "t1"], ["t2"], ["t3", "t4", "t5"]]
    assert [n for b in cut for n, _ in b] == [n for n, _ in named]
    assert list(buckets([], 10)) == []


def test_a_refusal_names_its_status_and_field() -> None:
    r = httpx.Response(400, json={"success": False, "message": "tensor x: no such tensor",
                                  "field": "names"})
    with pytest.raises(WeightPushError) as e:
        _answer(r)
    assert (e.value.status, e.value.field) == (400, "names") and "no such" in str(e.value)
    with pytest.raises(WeightPushError) as e:
        _answer(None)  # no answer within the deadline
    assert e.value.status == 504
    assert _answer(httpx.Response(200, json={"success": True})) == {"success": True}
