"""Per-rank decode timelines: conservation, reference agreement, admission (modelled)."""

from __future__ import annotations

import numpy as np
import pytest

from bubblespec.sim.rollout import (
    Requests,
    admission,
    brute_force_finish,
    build_timeline,
    forwards_per_phase,
)
from tests.sim.helpers import make_requests


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slots", [2, 5, 1000])
def test_timeline_matches_forward_by_forward_reference(et, seed, slots):
    rng = np.random.default_rng(seed)
    req = make_requests(rng, ranks=4, size=30)
    tl = build_timeline(req, 4, slots, et)
    ref = brute_force_finish(req, 4, slots, et)
    np.testing.assert_allclose(tl.finish_t, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_conservation_of_work(et, seed):
    rng = np.random.default_rng(seed)
    req = make_requests(rng, ranks=5, size=200, max_len=500)
    tl = build_timeline(req, 5, 16, et)
    per_rank = np.bincount(req.rank, weights=req.length, minlength=5)
    np.testing.assert_allclose(tl.emitted, per_rank, rtol=1e-9)
    f1, f2 = forwards_per_phase(req)
    # each phase emits exactly its tokens within its forwards, never more than 1 + accepted
    assert np.all(f1 * (1 + req.acc_cov) >= req.covered - 1e-9)
    assert np.all(f2 * (1 + req.acc_unc) >= req.length - req.covered - 1e-9)
    assert np.all((f1 - 1) * (1 + req.acc_cov) < req.covered + 1e-9)
    # every rank ran as many forwards as its last request needed
    start = admission(req.rank, f1 + f2, 5, 16)
    for r in range(5):
        idx = req.rank == r
        assert tl.finish_k[r] == ((start + f1 + f2)[idx].max() if idx.any() else 0)


def test_admission_is_fcfs_with_a_slot_limit():
    rank = np.zeros(5, dtype=np.int64)
    start = admission(rank, np.array([10, 3, 7, 2, 4]), 1, 2)
    # slots free at 3 (req 1) -> req 2 starts at 3, then at 10 and 10 -> reqs 3, 4
    assert start.tolist() == [0, 0, 3, 10, 10]
    assert admission(rank, np.array([10, 3, 7, 2, 4]), 1, 5).tolist() == [0] * 5


def test_empty_ranks_finish_at_zero(et):
    req = Requests(rank=np.array([1, 1]), length=np.array([10, 20]), covered=np.zeros(2, int),
                   acc_cov=np.zeros(2), acc_unc=np.zeros(2), drafted_cov=np.zeros(2),
                   drafted_unc=np.zeros(2), prefill=np.zeros(2))
    tl = build_timeline(req, 3, 8, et)
    assert tl.finish_t[0] == 0 and tl.finish_t[2] == 0 and tl.finish_k.tolist() == [0, 20, 0]


def test_more_acceptance_never_slows_a_rank(et):
    rng = np.random.default_rng(3)
    base = make_requests(rng, ranks=3, size=60, covered=False, max_len=400)
    prev = None
    for a in (0.0, 0.3, 0.7, 1.5, 3.0):
        req = Requests(**{**base.__dict__, "acc_unc": np.full(60, a),
                          "drafted_unc": np.full(60, 3.0)})
        t = build_timeline(req, 3, 1000, et).finish_t
        if prev is not None:
            assert np.all(t <= prev + 1e-12)
        prev = t
