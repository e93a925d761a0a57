"""Paced forwards (`bubblespec.engine.pace`): the shape read from the scheduler, the paced time
from the one engine-time model, sleeping the rest, overrun accounting and the validity rule.
Pure: a fake clock, no engine."""

from __future__ import annotations

import pytest

from bubblespec.core.engine_time import EngineTime
from bubblespec.engine.pace import (
    ForwardShape,
    Pacer,
    engine_time,
    forward_shape,
    merge_stats,
    stats_delta,
)


class FakeClock:
    """A clock that `sleep` and `work` advance (records the sleeps)."""

    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.sleeps.append(s)
        self.t += s

    def work(self, s: float) -> None:
        self.t += s


def _pacer(scale: float = 10.0) -> tuple[Pacer, FakeClock]:
    clk = FakeClock()
    return Pacer(engine_time("h100"), scale, clock=clk, sleep=clk.sleep), clk


def test_forward_shape_splits_decode_drafts_context_and_prefill() -> None:
    shape = forward_shape(
        new_reqs=[("new", 16)],
        cached=[("a", 100), ("b", 50), ("c", 7), ("idle", 9)],
        num_scheduled={"new": 40, "a": 4, "b": 1, "c": 12},
        spec={"a": [5, 6, 7]})
    # a: 1 + 3 drafts; b: 1; c: 1 decode + 11 chunked-prefill tokens; idle not scheduled
    assert shape == ForwardShape(tokens=6, context=157, prefill=40 + 11, drafts=3)


def test_paced_time_is_the_engine_time_model_times_scale() -> None:
    pacer, _ = _pacer(scale=7.0)
    et = EngineTime.preset("h100")
    shape = ForwardShape(tokens=300, context=50_000, prefill=64)
    expect = 7.0 * (et.t_fixed + et.t_token * 300 + et.t_flop * (300 - et.ridge)
                    + et.t_kv * 50_000 + et.t_flop * 64)
    assert pacer.paced_seconds(shape) == pytest.approx(expect)
    # memory-bound below the ridge: drafted tokens are nearly free
    one = pacer.paced_seconds(ForwardShape(16, 0, 0))
    many = pacer.paced_seconds(ForwardShape(16 * 9, 0, 0))
    assert many < 1.1 * one


def test_forward_sleeps_the_rest_of_its_paced_time() -> None:
    pacer, clk = _pacer()
    shape = ForwardShape(tokens=16, context=4000, prefill=0)
    paced = pacer.paced_seconds(shape)
    t0 = clk.t
    pacer.begin(shape)
    clk.work(0.25 * paced)
    pacer.end()
    assert clk.t - t0 == pytest.approx(paced)
    assert clk.sleeps == [pytest.approx(0.75 * paced)]
    s = pacer.stats
    assert (s.forwards, s.overruns, s.valid) == (1, 0, True)
    assert s.as_dict()["modelled_s"] == pytest.approx(paced / 10.0)


def test_drafting_is_charged_on_top_of_the_forward_unscaled_in_modelled_time() -> None:
    """The proposer's CPU time within a forward adds scale x its seconds to the forward's
    wall time (its seconds to modelled time), as a GPU host pays it; uncharged it is only
    counted. Drafting outside a forward is ignored."""
    shape = ForwardShape(tokens=16, context=4000, prefill=0)
    for charge in (True, False):
        clk = FakeClock()
        pacer = Pacer(engine_time("h100"), 10.0, charge_drafting=charge, clock=clk,
                      sleep=clk.sleep)
        paced = pacer.paced_seconds(shape)
        pacer.drafted(5.0)  # no forward: ignored
        t0 = clk.t
        pacer.begin(shape)
        clk.work(0.1 * paced)
        pacer.drafted(0.002)
        clk.work(0.002)
        pacer.end()
        s = pacer.stats.as_dict()
        assert s["drafting_s"] == pytest.approx(0.002)
        extra = 10.0 * 0.002 if charge else 0.0
        assert clk.t - t0 == pytest.approx(paced + extra)
        assert s["modelled_s"] == pytest.approx(paced / 10.0 + (0.002 if charge else 0.0))
        assert s["charged_s"] == pytest.approx(0.002 if charge else 0.0)
        assert s["overruns"] == 0
    # the next forward starts clean
    pacer.begin(shape)
    pacer.end()
    assert pacer.stats.drafting_s == pytest.approx(0.002)


def test_overrun_is_counted_and_not_slept() -> None:
    pacer, clk = _pacer()
    shape = ForwardShape(tokens=16, context=0, prefill=0)
    paced = pacer.paced_seconds(shape)
    pacer.begin(shape)
    clk.work(1.5 * paced)
    pacer.end()
    s = pacer.stats
    assert (s.forwards, s.overruns) == (1, 1)
    assert s.overrun_s == pytest.approx(0.5 * paced)
    assert s.worst_ratio == pytest.approx(1.5)
    assert clk.sleeps == []
    assert not s.valid


def test_validity_needs_under_one_percent_overruns() -> None:
    pacer, clk = _pacer()
    shape = ForwardShape(tokens=8, context=0, prefill=0)
    for i in range(200):
        pacer.begin(shape)
        clk.work(2.0 * pacer.paced_seconds(shape) if i < 2 else 0.0)
        pacer.end()
        clk.work(10.0)  # idle between forwards: nothing absorbed
    assert pacer.stats.overruns == 2
    assert pacer.stats.overrun_share == pytest.approx(0.01)
    assert not pacer.stats.valid  # 1% is not under 1%
    merged = merge_stats([pacer.stats.as_dict(), {"forwards": 200}])
    assert merged["overruns"] == 2 and merged["forwards"] == 400 and merged["valid"]
    delta = stats_delta(merged, {"forwards": 100, "overruns": 1})
    assert (delta["forwards"], delta["overruns"], delta["valid"]) == (300, 1, True)


def test_step_overhead_between_forwards_is_inside_the_paced_time() -> None:
    pacer, clk = _pacer()
    shape = ForwardShape(tokens=16, context=0, prefill=0)
    paced = pacer.paced_seconds(shape)
    pacer.begin(shape)
    pacer.end()
    t1 = clk.t
    clk.work(0.2 * paced)  # scheduler / output processing of the engine core
    pacer.begin(shape)
    pacer.end()
    assert clk.t - t1 == pytest.approx(paced)  # back-to-back forwards: one paced time each
    clk.work(5 * paced)  # idle engine: the next forward is paced from its own start
    t2 = clk.t
    pacer.begin(shape)
    pacer.end()
    assert clk.t - t2 == pytest.approx(paced)
    assert pacer.stats.overruns == 0


def test_end_without_begin_and_bad_settings() -> None:
    pacer, _ = _pacer()
    pacer.end()
    assert pacer.stats.forwards == 0 and not pacer.active
    with pytest.raises(ValueError, match="scale"):
        Pacer(engine_time("h200"), 0.0)
    with pytest.raises(ValueError, match="h100, h200"):
        engine_time("a100")


def test_ratio_histogram_gives_the_scale_that_would_have_been_valid() -> None:
    pacer, clk = _pacer(scale=10.0)
    shape = ForwardShape(tokens=8, context=0, prefill=0)
    paced = pacer.paced_seconds(shape)
    for i in range(100):
        pacer.begin(shape)
        clk.work(paced * (3.0 if i < 5 else 0.5))  # 5% of the forwards take 3x their time
        pacer.end()
        clk.work(100.0)
    d = pacer.stats.as_dict()
    assert d["overruns"] == 5 and not d["valid"]
    assert d["ratio_p50"] == pytest.approx(0.5)
    assert 3.0 <= d["ratio_p99"] < 3.0 * 2 ** 0.25
    assert d["scale_for_valid"] == pytest.approx(10.0 * d["ratio_p99"])
    merged = merge_stats([d, d])
    assert merged["ratio_p99"] == d["ratio_p99"] and sum(merged["ratio_hist"]) == 200
    delta = stats_delta(merged, d)
    assert delta["ratio_hist"] == d["ratio_hist"] and delta["scale"] == 10.0


def test_rank_pace_body_carries_every_counter() -> None:
    from bubblespec.protocol.rank import PaceBody

    pacer, _ = _pacer()
    pacer.begin(ForwardShape(4, 10, 0))
    pacer.end()
    d = pacer.stats.as_dict()
    body = PaceBody(**d).model_dump()
    assert set(d) <= set(body)
    assert body["forwards"] == 1 and body["profile"] == "h100" and body["valid"]


def test_keyed_costs_are_charged_host_measured_device_modelled() -> None:
    """The keyed sampler's and verifier's host seconds are charged as measured, their
    kernels at `EngineTime.keyed_kernel_s` over positions x the modelled vocabulary; a call
    outside a forward is ignored."""
    from bubblespec.core.engine_time import MODEL_VOCAB

    et = engine_time("h100")
    shape = ForwardShape(tokens=64 * 5, context=64 * 900, prefill=0)
    for kernel in ("fused", "eager"):
        clk = FakeClock()
        pacer = Pacer(et, 10.0, keyed_kernel=kernel, clock=clk, sleep=clk.sleep)
        plain = pacer.paced_seconds(shape)
        pacer.product(9.0, 10, 10)  # no forward: ignored
        pacer.begin(shape)
        pacer.product(0.0004, 64, 3)  # the sampler: 64 rows
        pacer.product(0.0006, 256, 3)  # the verifier: 256 drafted positions
        pacer.end()
        s = pacer.stats.as_dict()
        device = et.keyed_kernel_s(320 * MODEL_VOCAB, 6, fused=kernel == "fused")
        assert s["product_host_s"] == pytest.approx(0.001)
        assert s["keyed_device_s"] == pytest.approx(device)
        assert s["keyed_elements"] == 320 * MODEL_VOCAB and s["keyed_launches"] == 6
        assert s["modelled_s"] == pytest.approx(plain / 10.0 + 0.001 + device)
        assert s["forward_s"] == pytest.approx(plain / 10.0)
    # the eager kernels move ~100x the bytes of the fused one
    assert et.keyed_kernel_s(1e8, 0, fused=False) > 20 * et.keyed_kernel_s(1e8, 0, fused=True)


def test_async_scheduling_overlaps_host_and_gpu() -> None:
    """Without speculation (overlap_host) a step takes max(GPU, host): the engine's host
    overhead is hidden while the forward is longer; with speculation it adds up."""
    et = engine_time("h100")
    shape = ForwardShape(tokens=64, context=64 * 900, prefill=0)
    serial = Pacer(et, 1.0).paced_seconds(shape)
    overlapped = Pacer(et, 1.0, overlap_host=True).paced_seconds(shape)
    assert serial == pytest.approx(et.forward(64, 64 * 900))
    assert overlapped == pytest.approx(serial - et.t_host)
    clk = FakeClock()
    pacer = Pacer(et, 1.0, overlap_host=True, charge_drafting=True, clock=clk, sleep=clk.sleep)
    pacer.begin(shape)
    pacer.drafted(0.001)  # host work under the GPU's: hidden too
    pacer.end()
    s = pacer.stats.as_dict()
    assert s["modelled_s"] == pytest.approx(overlapped)
    assert s["async_hidden_s"] == pytest.approx(et.t_host + 0.001)
    # host work longer than the GPU's: the step lasts the host's
    pacer.begin(ForwardShape(tokens=1, context=0, prefill=0))
    pacer.drafted(0.05)
    pacer.end()
    assert pacer.stats.as_dict()["modelled_s"] == pytest.approx(overlapped + et.t_host + 0.05)


def test_unknown_keyed_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="keyed_kernel"):
        Pacer(engine_time("h100"), 1.0, keyed_kernel="triton")


def test_calls_between_steps_are_charged_to_the_next_forward() -> None:
    clk = FakeClock()
    pacer = Pacer(engine_time("h100"), 1.0, clock=clk, sleep=clk.sleep)
    shape = ForwardShape(tokens=16, context=0, prefill=0)
    plain = pacer.paced_seconds(shape)
    pacer.between(0.003)
    pacer.between(0.001)
    pacer.begin(shape)
    pacer.end()
    pacer.begin(shape)
    pacer.end()
    s = pacer.stats.as_dict()
    assert s["product_host_s"] == pytest.approx(0.004)
    assert s["between_s"] == pytest.approx(0.004)  # all of it was calls between steps
    assert s["modelled_s"] == pytest.approx(2 * plain + 0.004)
    pacer.begin(shape)
    pacer.product(0.002, 16, 3)  # a keyed call inside the forward: not between steps
    pacer.end()
    s = pacer.stats.as_dict()
    assert s["product_host_s"] == pytest.approx(0.006) and s["between_s"] == pytest.approx(0.004)
