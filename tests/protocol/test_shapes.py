"""One batch or a list of batches (`protocol/shapes.py`), told apart the same way for every
prompt form the client, the batcher and the gateway take."""

from __future__ import annotations

import numpy as np
import pytest

from bubblespec.protocol.gateway import PromptIn
from bubblespec.protocol.shapes import is_batch_list, is_prompt, is_token_id


@pytest.mark.parametrize("x", [3, np.int64(3), np.array(3)])
def test_token_ids(x):
    assert is_token_id(x)


@pytest.mark.parametrize("x", [[3], "3", np.array([3]), 3.0])
def test_not_token_ids(x):
    assert not is_token_id(x)


ONE_BATCH = [
    [[1, 2], [3]],
    ["some text", "more"],
    [{"input_ids": [1]}, {"text": "x"}],
    [PromptIn(input_ids=[1, 2])],
    [np.array([1, 2]), np.array([3])],
    np.array([[1, 2], [3, 4]]),
    [[np.int32(1)], [2]],
]
BATCHES = [
    [[[1, 2]], [[3]]],
    [["some text"], ["more", "and more"]],
    [[{"input_ids": [1]}], []],
    [[], [[1, 2]]],
    [[PromptIn(text="x")], [PromptIn(input_ids=[1])]],
    [np.array([[1, 2]]), np.array([[3, 4], [5, 6]])],
    [[]],
]


@pytest.mark.parametrize("items", ONE_BATCH)
def test_one_batch(items):
    assert not is_batch_list(items)
    assert all(is_prompt(p) for p in items)


@pytest.mark.parametrize("items", BATCHES)
def test_list_of_batches(items):
    assert is_batch_list(items)


def test_seed_rows_follow_the_same_rule():
    assert not is_batch_list([[1, 2, 3], [4]])
    assert is_batch_list([[[1, 2]], [[3], [4]]])
    assert not is_batch_list([])
