"""What a rank reports with ReportDone (`rank/worker.py: flips_of`): only the samples that
left their pre-generated draft where a token flipped, not where the draft ran out, nor the
ones that followed it or had none."""

from __future__ import annotations

from bubblespec.engine.types import GenResult, SampleResult
from bubblespec.protocol.domain import Flip
from bubblespec.protocol.limits import MAX_FLIPS
from bubblespec.protocol.sample import SampleMeta
from bubblespec.rank.worker import flips_of


def sample(index: int, diverged: int | None, ran_out: bool | None) -> SampleResult:
    return SampleResult([1, 2, 3], [0.0] * 3, index, SampleMeta(
        finish_reason="stop", weight_version=1, completion_tokens=3,
        first_divergence=diverged, draft_ran_out=ran_out))


def test_only_flipped_samples_are_reported_with_their_group_and_position() -> None:
    results = [GenResult("g0", [sample(0, 2, False), sample(1, None, None)]),
               GenResult("g1", [sample(0, 1, True), sample(3, 0, False)])]
    assert flips_of(results) == [Flip("g0", 0, 2), Flip("g1", 3, 0)]
    assert flips_of([]) == []


def test_a_huge_shard_reports_no_more_flips_than_a_report_may_carry() -> None:
    many = [GenResult(f"g{i}", [sample(0, 1, False)]) for i in range(MAX_FLIPS + 5)]
    assert len(flips_of(many)) == MAX_FLIPS
