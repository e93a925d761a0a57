"""The divergence counters of the batch step (`DraftCounters`: first_divergence, accepted_after_divergence, recouplings, ran_out): where a response first
left its aligned pre-generated response, the draft tokens accepted at or after that
position, the re-couplings after it, and whether it left because the response ended. Each implementation (pure Python and native) is
driven like an engine (each step emits the accepted prefix of the last draft plus one token
of the true response) and checked against counts kept by the driver itself, from the
positions each step accepted."""

from __future__ import annotations

from typing import Any

import pytest

from bubblespec.core import DraftParams
from bubblespec.core.backend import implementations
from bubblespec.core.batch import DraftCounters
from bubblespec.core.candidates import Calibration, DrafterStats

IMPLS = implementations()


def run(impl: dict[str, Any], truth: list[int], aligned: list[int] | None,
        k: int = 4) -> tuple[DraftCounters, int, int]:
    """Decode `truth` through `impl`'s step; the request's stats and the driver's own count
    of accepted tokens at or after the first position where truth and aligned differ."""
    idx = impl["SuffixIndex"](max_depth=8)
    idx.add_sequence(("out", 0), 0, [], live=True)
    m = idx.matcher(0, [1, 2], use_global=False)
    req = impl["Request"](0, ("out", 0), m, None, aligned=aligned,
                          aligned_on=aligned is not None, tail=[], n_out=0, out=[])
    al = aligned or []
    div = next((i for i, t in enumerate(truth) if i >= len(al) or al[i] != t), None) \
        if al else None
    cal, src = Calibration(prior=4.0), DrafterStats()
    pos, draft, after = 0, [], 0
    while pos < len(truth):
        a = 0
        while a < len(draft) and pos + a < len(truth) and draft[a] == truth[pos + a]:
            a += 1
        new = truth[pos:pos + a + 1]
        if draft and div is not None:
            after += sum(1 for p in range(pos, pos + len(new) - 1) if p >= div)
        pos += len(new)
        (draft,) = impl["step"](idx, [req], [new], [2 + pos], k, 4096, DraftParams(), cal,
                                src, extend_index=True, keep_out=False, drafts=None)
    return DraftCounters.of(req.counters), after, -1 if div is None else div


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_counts_the_tail_after_a_local_edit_and_the_recoupling(name: str) -> None:
    aligned = list(range(10, 40))
    truth = list(aligned)
    truth[8] = 99  # one flipped token; the rest re-joins at the same positions
    stats, after, div = run(IMPLS[name], truth, aligned)
    assert stats.first_divergence == div == 8
    assert stats.ran_out == 0  # a flipped token, not the draft's end
    assert stats.recouplings == 1  # re-coupled once, RESYNC tokens after the edit
    assert stats.accepted_after_divergence == after > 0
    assert stats.accepted >= max(stats.accepted_pregen, stats.accepted_after_divergence)
    assert stats.accepted_pregen > 0


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_a_response_that_follows_its_draft_never_diverges(name: str) -> None:
    aligned = list(range(10, 40))
    stats, after, div = run(IMPLS[name], list(aligned), aligned)
    assert (stats.accepted_after_divergence, stats.first_divergence, stats.recouplings, stats.ran_out) == (0, -1, 0, 0) and div == -1
    assert after == 0
    assert stats.accepted_pregen == stats.accepted > 0  # every accepted token came from the aligned response


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_running_past_the_drafts_end_is_a_divergence(name: str) -> None:
    aligned = list(range(10, 30))
    truth = aligned + [50, 51, 52, 50, 51, 52, 50, 51, 52]
    stats, after, div = run(IMPLS[name], truth, aligned)
    assert stats.first_divergence == div == len(aligned)
    assert stats.ran_out == 1  # the draft ran out (a pre-generation cut short by the stop)
    assert stats.accepted_after_divergence == after and stats.recouplings == 0


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_a_different_trajectory_counts_its_suffix_drafted_tail(name: str) -> None:
    """After an early break with no re-join, what drafts still cover comes from the other
    sources (here the request's own repeating output)."""
    aligned = list(range(10, 40))
    truth = aligned[:5] + [7, 8, 9] * 10
    stats, after, div = run(IMPLS[name], truth, aligned)
    assert stats.first_divergence == div == 5 and stats.recouplings == 0 and stats.ran_out == 0
    assert stats.accepted_after_divergence == after > 0


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_no_aligned_response_no_divergence(name: str) -> None:
    stats, after, div = run(IMPLS[name], [7, 8, 9] * 10, None)
    assert (stats.accepted_after_divergence, stats.first_divergence, stats.recouplings, after, div) == (0, -1, 0, 0, -1)


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_an_empty_pre_generated_response_is_none(name: str) -> None:
    """A pre-generation task stopped before its first token leaves an empty response: the
    output never followed it, so it has no divergence (not one at position 0)."""
    stats, _, _ = run(IMPLS[name], [7, 8, 9] * 10, [])
    assert (stats.accepted_after_divergence, stats.first_divergence, stats.recouplings) == (0, -1, 0)
