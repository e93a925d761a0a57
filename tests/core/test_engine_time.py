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
