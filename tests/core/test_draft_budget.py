"""The per-step draft cap (`core/draft_budget.py`): full drafts where verified tokens are
nearly free, shorter ones at large batches unless they are accepted, learning from what the
drafts gave, and a probe that keeps learning when the best cap is 0."""

from __future__ import annotations

import numpy as np
import pytest

from bubblespec.core.draft_budget import PROBE_EVERY, DraftBudget
from bubblespec.core.engine_time import EngineTime

H100 = EngineTime.preset("h100")


def _budget(p: float, k_max: int = 8) -> DraftBudget:
    b = DraftBudget(H100, k_max, prior_accepted=1000 * p, prior_rejected=1000 * (1 - p))
    assert b.p == pytest.approx(p)
    return b


def test_small_batch_drafts_in_full() -> None:
    """16 rows x 9 tokens = 144 tokens, under the ridge (184): drafting costs only `t_token`
    per token there, so every request whose drafts are accepted at all drafts in full."""
    for p in (0.8, 0.9, 0.95):
        assert _budget(p).caps(np.full(16, p), 16 * 600).tolist() == [8] * 16


def test_large_batch_caps_by_acceptance() -> None:
    low, mid, high = (_budget(p).caps(np.full(128, p), 128 * 600).mean()
                      for p in (0.3, 0.8, 0.95))
    assert low < 1 < mid < high < 8  # no fixed length of 8 at 128 rows


def _rate(p: np.ndarray, caps: np.ndarray, ctx: float) -> float:
    tokens = len(p) + sum(sum(pi ** j for j in range(1, c + 1)) for pi, c in zip(p, caps))
    return tokens / H100.forward(len(p) + int(caps.sum()), ctx)


def test_caps_maximise_modelled_throughput() -> None:
    """No other allocation found by perturbing the chosen one does better."""
    rng = np.random.default_rng(0)
    b = _budget(0.7)
    p = rng.uniform(0.05, 0.98, 96)
    ctx = 96 * 900.0
    best = b.caps(p, ctx)
    base = _rate(p, best, ctx)
    for _ in range(300):
        other = np.clip(best + rng.integers(-2, 3, 96), 0, 8)
        assert _rate(p, other, ctx) <= base + 1e-9
    assert _rate(p, np.full(96, 8), ctx) < base and _rate(p, np.zeros(96, int), ctx) < base


def test_observe_learns_geometric_acceptance() -> None:
    b = DraftBudget(H100, 8, decay=1.0, prior_accepted=0.0, prior_rejected=1e-9)
    # drafts of 4: two accepted whole (4 + bonus), one cut after 1, one after 0; no draft
    b.observe(np.array([4, 4, 4, 4, 0]), np.array([5, 5, 2, 1, 1]))
    assert b.accepted == pytest.approx(4 + 4 + 1 + 0)
    assert b.rejected == pytest.approx(2)
    assert b.p == pytest.approx(9 / 11, rel=1e-6)
    b.observe(np.array([0, 0]), np.array([1, 0]))  # nothing drafted: no evidence
    assert b.p == pytest.approx(9 / 11, rel=1e-6)


def test_decay_follows_a_changed_run() -> None:
    b = _budget(0.9)
    for _ in range(400):
        b.observe(np.full(64, 4), np.full(64, 1))  # every draft rejected at once
    assert b.p < 0.05


def test_probe_when_every_cap_is_zero() -> None:
    b = _budget(0.0001)
    caps = [b.next_caps(np.full(256, b.p), 256 * 2000) for _ in range(3 * PROBE_EVERY)]
    assert not b.caps(np.full(256, b.p), 256 * 2000).any()
    assert [c.max() for c in caps].count(1) == 3
    assert all(c.min() == c.max() for c in caps)


def test_bounds() -> None:
    assert DraftBudget(H100, 0).caps(np.full(64, 0.5), 1000).tolist() == [0] * 64
    assert _budget(0.9).caps(np.zeros(0), 0).tolist() == []
    with pytest.raises(ValueError):
        DraftBudget(H100, -1)


def test_request_p_keeps_aligned_drafts_long() -> None:
    """A few requests whose drafts are accepted whole keep long drafts in a batch whose other
    drafts fail: they are the ones that pay for the tokens."""
    b = _budget(0.3)
    acc = np.array([400] * 8 + [2] * 120)
    rejections = np.array([5] * 8 + [40] * 120)
    p = b.request_p(acc, rejections)
    assert p[0] > 0.85 and p[-1] < 0.1
    caps = b.caps(p, 128 * 600)
    assert caps[:8].min() >= 6 and caps[8:].max() == 0


@pytest.mark.parametrize("impl", ["python", "native"])
def test_step_honours_caps(impl: str) -> None:
    """`step`'s per-request caps cut drafts in both implementations."""
    from bubblespec.core import DraftParams
    from bubblespec.core.backend import implementations
    from bubblespec.core.candidates import Calibration, DrafterStats

    impls = implementations()
    if impl not in impls:
        pytest.skip("native module not built")
    m = impls[impl]
    idx = m["SuffixIndex"](max_depth=16, token_budget=None)
    resp = list(range(1, 30))
    idx.add_sequence(("pre", 0), "g", resp)
    reqs = []
    for i in range(3):
        idx.add_sequence(("out", i), "g", [], live=True)
        reqs.append(m["Request"]("g", ("out", i), idx.matcher("g", [], use_global=False),
                                 None, aligned=resp, aligned_on=True, tail=[], n_out=0, out=[]))
    out = m["step"](idx, reqs, [[1], [1], [1]], [5, 5, 5], 8, 1000, DraftParams(max_spec_tokens=8),
                    Calibration(), DrafterStats(), caps=[0, 3, 12])
    assert [len(d) for d in out] == [0, 3, 8]
    assert [r.last_draft for r in reqs] == [0, 3, 8]


def test_a_binding_cap_does_not_hold_the_estimate_down() -> None:
    """Drafts capped at 3 and accepted whole are no evidence of rejection: p_i rises and the
    cap with it (the estimate is not self-fulfilling)."""
    b = _budget(0.8)
    acc, rej = np.zeros(64), np.zeros(64)
    caps = b.caps(b.request_p(acc, rej), 64 * 900)
    for _ in range(40):
        acc += caps  # every capped draft accepted whole: no rejection
        caps = b.caps(b.request_p(acc, rej), 64 * 900)
    assert caps.min() == 8


def test_under_the_ridge_the_caps_may_be_skipped() -> None:
    b = _budget(0.5)
    assert b.under_ridge(16) and b.under_ridge(20)  # 20 x 9 = 180 <= 184.5
    assert not b.under_ridge(21) and not b.under_ridge(64)
