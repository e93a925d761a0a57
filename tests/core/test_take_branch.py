"""Margin branches in the batch step (`core.batch.take_branch` + `Request.follow_branch`,
both implementations): a response that leaves its aligned draft where a branch takes the
sampled token follows the branch, drafts from it at once, and counts the departure as its
first divergence; a branch that does not fit (another token, another position, another
prefix) changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from bubblespec.core import DraftParams
from bubblespec.core.backend import implementations
from bubblespec.core.batch import DraftCounters, take_branch
from bubblespec.core.candidates import Calibration, DrafterStats

IMPLS = implementations()


def decode(impl: dict[str, Any], truth: list[int], aligned: list[int],
           branches: list[tuple[int, list[int]]], k: int = 4) -> tuple[DraftCounters, int, int]:
    """Decode `truth` like an engine (accepted draft prefix + one token per step), calling
    take_branch before each step as the proposer does; (stats, forwards, switches)."""
    idx = impl["SuffixIndex"](max_depth=8)
    idx.add_sequence(("out", 0), 0, [], live=True)
    m = idx.matcher(0, [1, 2], use_global=False)
    req = impl["Request"](0, ("out", 0), m, None, aligned=aligned, aligned_on=True,
                          tail=[], n_out=0, out=[])
    al, cal, src = list(aligned), Calibration(prior=4.0), DrafterStats()
    pos, draft, forwards, switches = 0, [], 0, 0
    while pos < len(truth):
        a = 0
        while a < len(draft) and pos + a < len(truth) and draft[a] == truth[pos + a]:
            a += 1
        new = truth[pos:pos + a + 1]
        pos += len(new)
        forwards += 1
        taken = take_branch(req, al, new, branches)
        if taken is not None:
            al, switches = taken, switches + 1
        (draft,) = impl["step"](idx, [req], [new], [2 + pos], k, 4096, DraftParams(), cal,
                                src, extend_index=False, keep_out=False, drafts=None)
    return DraftCounters.of(req.counters), forwards, switches


MAIN = list(range(100, 160))
FLIP = 20
BRANCH = MAIN[:FLIP] + [7] + list(range(300, 339))  # the runner-up 7 at 20, then its own tail


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_the_output_takes_the_branch(name: str) -> None:
    with_branch, f1, s1 = decode(IMPLS[name], BRANCH, MAIN, [(FLIP, BRANCH)])
    without, f0, s0 = decode(IMPLS[name], BRANCH, MAIN, [])
    assert (s1, s0) == (1, 0)
    # left its pre-generated response at 20
    assert with_branch.first_divergence == without.first_divergence == FLIP
    assert f1 < f0 / 2  # the tail came from the branch
    assert with_branch.accepted_after_divergence > 30  # the branch's tail
    assert with_branch == decode(IMPLS[name], BRANCH, MAIN, [(FLIP, BRANCH)])[0]


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_branches_that_do_not_fit_change_nothing(name: str) -> None:
    base = decode(IMPLS[name], BRANCH, MAIN, [])
    other_token = MAIN[:FLIP] + [8] + list(range(300, 339))
    other_pos = MAIN[:FLIP + 1] + [7] + list(range(300, 338))
    other_prefix = [1] + MAIN[1:FLIP] + [7] + list(range(300, 339))
    for br in ([(FLIP, other_token)], [(FLIP + 1, other_pos)], [(FLIP, other_prefix)]):
        assert decode(IMPLS[name], BRANCH, MAIN, br) == base


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_a_branch_of_a_branch_position_after_the_first(name: str) -> None:
    second = BRANCH[:40] + [9] + list(range(500, 519))  # a branch of the main at 40 ...
    truth = BRANCH[:40] + [9] + list(range(500, 519))
    # ... does not fit once the output follows the branch at 20 (other prefix): only one switch
    _, _, switches = decode(IMPLS[name], truth, MAIN, [(FLIP, BRANCH), (40, second)])
    assert switches == 2  # 20 -> BRANCH, then 40 -> second (its prefix is BRANCH's)
    main_branch = MAIN[:40] + [9] + list(range(500, 519))
    _, _, switches = decode(IMPLS[name], truth, MAIN, [(FLIP, BRANCH), (40, main_branch)])
    assert switches == 1
