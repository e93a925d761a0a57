"""The forward-time model: preset derivation and the closed-form series (modelled)."""

from __future__ import annotations

import numpy as np
import pytest

from bubblespec.core.engine_time import EngineTime


@pytest.fixture
def et() -> EngineTime:
    """The default H100 engine-time model."""
    return EngineTime.preset("h100")


def test_h100_preset_matches_the_documented_derivation(et):
    d = et.describe()
    assert d["t_fixed_ms"] == pytest.approx(7.99, abs=0.01)
    assert d["t_flop_us"] == pytest.approx(32.5, abs=0.1)
    assert d["ridge_tokens"] == pytest.approx(184.5, abs=0.5)
    assert d["t_kv_ns"] == pytest.approx(48.9, abs=0.05)
    h200 = EngineTime.preset("h200").describe()
    assert h200["t_fixed_ms"] == pytest.approx(6.18, abs=0.01)
    assert h200["t_fixed_ms"] < d["t_fixed_ms"]


def test_unknown_gpu_is_refused():
    with pytest.raises(ValueError):
        EngineTime.preset("tpu")


def test_memory_bound_below_ridge_compute_bound_above(et):
    below = et.per_forward(100.0) - et.per_forward(99.0)
    above = et.per_forward(1001.0) - et.per_forward(1000.0)
    assert below == pytest.approx(et.t_token)
    assert above == pytest.approx(et.t_token + et.t_flop)


@pytest.mark.parametrize("m,tokens,ctx0,growth", [(1, 5, 100, 3), (37, 300, 9000, 12.5),
                                                   (1000, 64, 0, 64)])
def test_segment_equals_the_sum_of_its_forwards(et, m, tokens, ctx0, growth):
    brute = sum(et.per_forward(tokens) + et.t_kv * (ctx0 + growth * j) for j in range(m))
    assert float(et.segment(np.array(m), np.array(tokens), np.array(ctx0),
                            np.array(growth))) == pytest.approx(brute, rel=1e-12)


def test_overrides_replace_only_given_fields(et):
    o = et.with_overrides(t_fixed=0.012, t_kv=None)
    assert o.t_fixed == 0.012 and o.t_kv == et.t_kv and "overrides" in o.gpu
    assert et.with_overrides() == et


@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("tokens,context", [(1, 0), (16, 20_000), (128, 300_000), (1_152, 1e6)])
def test_charged_forwards_equal_the_paced_step(gpu, tokens, context):
    """The simulator's per-forward model of a charged engine (`charged`) gives the step the
    paced engines sleep to (`step`): async scheduling takes the longer side, a speculative
    engine's host work is paid in series."""
    et = EngineTime.preset(gpu)
    for extra in (0.0, 4e-4, 1.3e-3):
        serial = et.charged(extra_host_s=extra)
        assert float(serial.per_forward(tokens)) + serial.t_kv * context == pytest.approx(
            et.step(tokens, context, host_s=extra), rel=1e-12)
        overlapped = et.charged(async_host=True, extra_host_s=extra)
        assert float(overlapped.per_forward(tokens)) + overlapped.t_kv * context == (
            pytest.approx(et.step(tokens, context, host_s=extra, overlap_host=True), rel=1e-12))
    # the async credit is the engine's host overhead, nothing else
    assert et.t_fixed - et.charged(async_host=True).t_fixed == pytest.approx(et.t_host)


def test_a_host_side_longer_than_the_gpu_bounds_an_async_forward():
    et = EngineTime.preset("h100")
    slow_host = et.charged(async_host=True, extra_host_s=10e-3)
    assert slow_host.t_fixed == pytest.approx(et.t_host + 10e-3)
    assert float(slow_host.per_forward(1)) >= et.step(1, 0, host_s=10e-3, overlap_host=True)
