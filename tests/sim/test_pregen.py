"""Pre-generation by lanes: queue order, refill, stop rule and lag, window, reference
(modelled)."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from bubblespec.sim.pregen import breadth_first, simulate_pregen


def reference_pregen(finish, next_lengths, et, inflight, rpc, prompt_len, accepted=0.0,
                     drafted=0.0, window=0.0, head=None, head_accepted=0.0):
    """Forward-by-forward reference of the rank's lane loop (slow); `head`: per task, tokens
    of an older draft verified first at 1 + `head_accepted` per forward."""
    prompts, n = next_lengths.shape
    order = breadth_first(prompts, n)
    flat = next_lengths.ravel()
    rate, hrate = 1.0 + accepted, 1.0 + head_accepted
    head = np.zeros(flat.size) if head is None else np.minimum(head, flat)

    def reached(i, d):  # tokens after d forwards, one forward at a time
        tok = 0.0
        for _ in range(d):
            tok = min(head[i], tok + hrate) if tok < head[i] else tok + rate
        return min(flat[i], tok)

    need = np.array([next(d for d in range(1, 10**6) if reached(i, d) >= flat[i])
                     for i in range(flat.size)])
    fmax = finish.max()
    end = fmax + window
    covered = np.zeros(flat.size, dtype=np.int64)
    stop = finish.astype(float).copy()
    lanes = {r: {} for r in range(len(finish))}
    seen = {r: set() for r in range(len(finish))}
    t = {r: float(finish[r]) for r in range(len(finish))}
    heap = [(t[r], r) for r in range(len(finish))
            if finish[r] < end and (window > 0 or finish[r] < fmax)]
    heapq.heapify(heap)
    q = 0
    while heap:
        _, r = heapq.heappop(heap)
        pre = 0.0
        if t[r] < end and q < len(order):
            if not lanes[r]:
                t[r] += rpc
            take = order[q:q + inflight - len(lanes[r])]
            q += len(take)
            for i in take:
                lanes[r][int(i)] = 0
                if i // n not in seen[r]:
                    seen[r].add(int(i // n))
                    pre += prompt_len * et.t_flop
        if not lanes[r]:
            stop[r] = max(t[r], finish[r])
            continue
        live = lanes[r]
        ctx = sum(prompt_len + reached(i, d) for i, d in live.items())
        t[r] += pre + float(et.per_forward(len(live) * (1.0 + drafted))) + et.t_kv * ctx
        for i in live:
            live[i] += 1
        if t[r] >= end:
            for i, d in live.items():
                covered[i] = int(np.floor(reached(i, d) + 1e-9))
            stop[r] = t[r] + rpc
            continue
        for i in [i for i, d in live.items() if d == need[i]]:
            covered[i] = flat[i]
            del live[i]
        heapq.heappush(heap, (t[r], r))
    return covered, stop


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("inflight,accepted,window", [(1, 0.0, 0.0), (3, 0.0, 0.0),
                                                      (4, 1.5, 0.0), (3, 0.0, 0.3)])
def test_matches_forward_by_forward_reference(et, seed, inflight, accepted, window):
    rng = np.random.default_rng(seed)
    finish = rng.uniform(0.1, 1.5, size=5)
    nxt = rng.integers(1, 90, size=(5, 4))
    pg = simulate_pregen(finish, nxt, et, inflight, 1e-3, 32.0, accepted, 2.0, window_s=window)
    cov, stop = reference_pregen(finish, nxt, et, inflight, 1e-3, 32.0, accepted, 2.0, window)
    np.testing.assert_array_equal(pg.covered, cov)
    np.testing.assert_allclose(pg.stop_t, stop, rtol=1e-9)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("inflight,accepted,window", [(3, 0.0, 0.0), (4, 1.5, 0.3)])
def test_refresh_heads_match_the_reference(et, seed, inflight, accepted, window):
    rng = np.random.default_rng(100 + seed)
    finish = rng.uniform(0.1, 1.5, size=5)
    nxt = rng.integers(1, 90, size=(5, 4))
    head = rng.integers(0, 120, size=20) * (rng.random(20) < 0.6)  # some tasks have none
    pg = simulate_pregen(finish, nxt, et, inflight, 1e-3, 32.0, accepted, 2.0,
                         window_s=window, head=head, head_accepted=3.0)
    cov, stop = reference_pregen(finish, nxt, et, inflight, 1e-3, 32.0, accepted, 2.0,
                                 window, head, 3.0)
    np.testing.assert_array_equal(pg.covered, cov)
    np.testing.assert_allclose(pg.stop_t, stop, rtol=1e-9)


def test_a_refresh_costs_fewer_forwards_than_generating_anew(et):
    finish = np.array([0.0, 2.0])
    nxt = np.full((4, 4), 400)
    fresh = simulate_pregen(finish, nxt, et, inflight=16)
    refresh = simulate_pregen(finish, nxt, et, inflight=16, head=np.full(16, 400),
                              head_accepted=7.0)
    assert fresh.pregen_tokens < nxt.sum()  # the bubble is too short to generate them anew
    assert np.array_equal(refresh.covered, nxt.ravel())  # verified whole, 8 tokens a forward
    assert refresh.busy_in_bubble[0] < 0.5 * fresh.busy_in_bubble[0]


def test_queue_is_breadth_first_and_lanes_refill(et):
    assert breadth_first(3, 2).tolist() == [0, 2, 4, 1, 3, 5]
    finish = np.array([1.0, 3.0, 3.0, 60.0])
    nxt = np.tile(np.array([20, 4000]), (50, 2))  # short and long samples alternate
    pg = simulate_pregen(finish, nxt, et, inflight=16)
    q = breadth_first(50, 4)
    claimed = np.nonzero(pg.covered > 0)[0]
    assert set(claimed) == set(q[:pg.tasks_claimed])
    # the first idle rank refills its lanes as the short tasks finish: it takes far more
    # than one batch of 16 before the others are free
    assert pg.tasks_claimed > 3 * 16
    assert np.all(pg.covered <= nxt.ravel())


@pytest.mark.parametrize("inflight", [1, 8, 64])
def test_stop_lag_is_one_forward_and_a_push(et, inflight):
    rng = np.random.default_rng(inflight)
    rpc, prompt = 1e-3, 128.0
    for _ in range(5):
        finish = rng.uniform(1.0, 40.0, size=12)
        nxt = rng.integers(1, 5000, size=(12, 4))
        pg = simulate_pregen(finish, nxt, et, inflight, rpc, prompt)
        lag = pg.stop_t - finish.max()
        worst_fwd = (float(et.per_forward(inflight)) + et.t_kv * inflight * (prompt + nxt.max())
                     + 12 * prompt * et.t_flop)
        assert lag.max() <= rpc + worst_fwd + 1e-9
        assert np.all(pg.stop_t >= finish - 1e-12)


def test_no_bubble_no_pregen(et):
    pg = simulate_pregen(np.full(4, 5.0), np.full((4, 2), 100), et)
    assert pg.tasks_claimed == 0 and pg.pregen_tokens == 0 and pg.busy_in_bubble.sum() == 0


def test_long_bubble_covers_everything_and_busy_never_exceeds_the_bubble(et):
    finish = np.array([0.0, 0.0, 1e4])
    nxt = np.full((10, 4), 300)
    pg = simulate_pregen(finish, nxt, et, inflight=4)
    assert np.array_equal(pg.covered, nxt.ravel())
    assert np.all(pg.busy_in_bubble <= finish.max() - finish + 1e-9)
    assert np.all(pg.stop_t <= finish.max() + 1e-9)  # ran dry: no lag


def test_training_window_covers_more_and_every_rank_takes_part(et):
    finish = np.array([0.2, 0.5, 1.0])
    nxt = np.full((6, 4), 400)
    bubble = simulate_pregen(finish, nxt, et, inflight=4)
    window = simulate_pregen(finish, nxt, et, inflight=4, window_s=1.0)
    assert window.pregen_tokens > bubble.pregen_tokens
    assert window.window_tokens > 0 and bubble.window_tokens == 0
    assert window.stop_t[2] > finish[2]  # the slowest rank pre-generated in the window
    assert np.all(window.stop_t <= finish.max() + 1.0 + 0.1)
