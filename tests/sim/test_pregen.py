"""Pre-generation in the bubble: queue order, stop rule, T lag bound, reference (modelled)."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from bubblespec.sim.pregen import BatchProfile, breadth_first, simulate_pregen


def reference_pregen(finish, next_lengths, et, T, claim, rpc, prompt_len):
    """Forward-by-forward reference of the worker loop (slow)."""
    prompts, n = next_lengths.shape
    order = breadth_first(prompts, n)
    flat = next_lengths.ravel()
    fmax = finish.max()
    covered = np.zeros(flat.size, dtype=np.int64)
    stop = finish.astype(float).copy()
    heap = [(float(finish[r]), r) for r in range(len(finish)) if finish[r] < fmax]
    heapq.heapify(heap)
    q = 0
    while heap:
        t, r = heapq.heappop(heap)
        if t >= fmax:
            stop[r] = t
            continue
        if q >= len(order):
            stop[r] = fmax
            continue
        idx = order[q:q + claim]
        q += len(idx)
        t += rpc + prompt_len * et.t_flop * len(idx)
        lens = flat[idx]
        k, stopped = 0, False
        while k < lens.max():
            live = lens > k
            t += float(et.per_forward(float(live.sum()))) + et.t_kv * float(
                (prompt_len + k) * live.sum())
            k += 1
            if k % T == 0 and k < lens.max() and t >= fmax:
                covered[idx] = np.minimum(lens, k)
                stop[r] = t + rpc
                stopped = True
                break
        if not stopped:
            covered[idx] = lens
            heapq.heappush(heap, (t + rpc, r))
    return covered, stop


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("T,claim", [(1, 3), (4, 2), (8, 16)])
def test_matches_forward_by_forward_reference(et, seed, T, claim):
    rng = np.random.default_rng(seed)
    finish = rng.uniform(0.1, 3.0, size=6)
    nxt = rng.integers(1, 150, size=(5, 4))
    pg = simulate_pregen(finish, nxt, et, T, claim, 1e-3, 32.0)
    cov, stop = reference_pregen(finish, nxt, et, T, claim, 1e-3, 32.0)
    np.testing.assert_array_equal(pg.covered, cov)
    np.testing.assert_allclose(pg.stop_t, stop, rtol=1e-9)


def test_batch_profile_time_matches_forward_sum(et):
    lens = np.array([5, 17, 17, 40, 3])
    prof = BatchProfile.build(lens, 100.0, et, accepted=1.0, drafted=2.0)
    f = np.ceil(lens / 2.0)
    g = lens / f
    for k in (0, 1, 3, 9, 20, 25):
        brute = 0.0
        for j in range(k):
            live = f > j
            if not live.any():
                break
            brute += float(et.per_forward(3.0 * live.sum())) + et.t_kv * float(
                (100.0 + g[live] * j).sum())
        assert prof.time_at(k, et) == pytest.approx(brute, rel=1e-12)
    assert prof.end == 20


def test_queue_is_breadth_first_and_claims_a_prefix(et):
    assert breadth_first(3, 2).tolist() == [0, 2, 4, 1, 3, 5]
    finish = np.array([1.0, 1.0, 1.0, 60.0])
    nxt = np.full((50, 4), 4000)
    pg = simulate_pregen(finish, nxt, et, poll_every=8, claim=16)
    claimed = np.nonzero(pg.covered > 0)[0]
    q = breadth_first(50, 4)
    assert set(claimed) == set(q[:pg.tasks_claimed])
    # three idle ranks claim 16 each; 4000 tokens at batch 16 take ~50 s < the 59 s bubble,
    # so each finishes its first batch (fully covered) and claims a second (cut at the stop)
    assert pg.tasks_claimed == 96
    assert np.all(pg.covered[q[:48]] == 4000)
    assert np.all((pg.covered[q[48:96]] > 0) & (pg.covered[q[48:96]] < 4000))
    assert np.all(pg.covered <= nxt.ravel())


@pytest.mark.parametrize("T", [1, 4, 16, 64])
def test_stop_lag_is_bounded_by_T_forwards(et, T):
    rng = np.random.default_rng(T)
    rpc, prompt, claim = 1e-3, 128.0, 8
    for _ in range(5):
        finish = rng.uniform(1.0, 40.0, size=12)
        nxt = rng.integers(1, 5000, size=(12, 4))
        pg = simulate_pregen(finish, nxt, et, T, claim, rpc, prompt)
        lag = pg.stop_t - finish.max()
        worst_fwd = float(et.per_forward(claim)) + et.t_kv * claim * (prompt + nxt.max())
        bound = 2 * rpc + claim * prompt * et.t_flop + T * worst_fwd
        assert lag.max() <= bound + 1e-9
        assert np.all(pg.stop_t >= finish - 1e-12)


def test_no_bubble_no_pregen(et):
    pg = simulate_pregen(np.full(4, 5.0), np.full((4, 2), 100), et)
    assert pg.tasks_claimed == 0 and pg.pregen_tokens == 0 and pg.busy_in_bubble.sum() == 0


def test_long_bubble_covers_everything_and_busy_never_exceeds_the_bubble(et):
    finish = np.array([0.0, 0.0, 1e4])
    nxt = np.full((10, 4), 300)
    pg = simulate_pregen(finish, nxt, et, claim=4)
    assert np.array_equal(pg.covered, nxt.ravel())
    assert np.all(pg.busy_in_bubble <= finish.max() - finish + 1e-9)
    assert np.all(pg.stop_t <= finish.max() + 1e-9)  # ran dry: no lag
