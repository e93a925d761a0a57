"""Scenario-level properties: bubble, speedup, monotonicity, determinism (modelled)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from bubblespec.sim.model import ControlPlane, SimConfig, run_scenario
from bubblespec.sim.policy import (
    ModeSpec,
    default_modes,
    load_accept_json,
    merge_modes,
    parse_mode_flag,
    solve_covered,
)
from bubblespec.sim.workload import LengthSource, assign_prompts

SMALL = {"prompts_per_rank": 4, "n": 8, "steps": 3, "max_num_seqs": 64}
SHORT = LengthSource.default(median=300, max_new_tokens=3000)


def by_name(rows):
    return {s.mode: s for s in rows}


@pytest.mark.parametrize("assign", ["round_robin", "lpt"])
def test_equal_lengths_give_no_bubble(tmp_path, et, assign):
    p = tmp_path / "l.json"
    p.write_text(json.dumps([777]))
    rows = run_scenario(SimConfig(**SMALL, assign=assign, lpt_noise=0.0), 8, default_modes(), et,
                        LengthSource.from_json(p))
    for s in rows:
        assert s.bubble_fraction == pytest.approx(0.0, abs=1e-12)
        assert s.coverage == 0 and s.stop_lag_s == 0


def test_zero_acceptance_gives_speedup_one(et):
    """With the host charges off (no async baseline, no product host time), useless drafts
    cost only the stop lag and the verification of what is never accepted."""
    modes = [ModeSpec("none", 0, 0), ModeSpec("zero", 0, 0),
             ModeSpec("bubblespec_zero", 0, 0, True, 0, 0), ModeSpec("costly", 0, 4)]
    free = SimConfig(**SMALL, async_baseline=False, spec_host_s=0.0)
    rows = by_name(run_scenario(free, 16, modes, et, SHORT))
    assert rows["zero"].speedup == pytest.approx(1.0, abs=1e-12)
    assert rows["zero"].cp_reduction == pytest.approx(0.0, abs=1e-12)
    # pre-generating with useless drafts only adds the (bounded) stop lag
    assert rows["bubblespec_zero"].speedup <= 1.0
    assert rows["bubblespec_zero"].speedup > 0.99
    assert rows["costly"].speedup <= 1.0  # verifying drafts that are never accepted costs


def test_charges_cost_a_speculative_mode_what_the_paced_engines_charge(et):
    """The baseline runs async-scheduled (its engine host overhead hidden) and a speculative
    mode pays its host work in series: with useless drafts and nothing pre-generated on the
    critical path, the speed-up is the ratio of the two per-forward costs."""
    modes = [ModeSpec("none", 0, 0), ModeSpec("useless", 0, 0, True, 0, 0),
             ModeSpec("useless_own_host", 0, 0, True, 0, 0, host_s=0.0)]
    lone = LengthSource.default(median=300, max_new_tokens=3000)
    charged = by_name(run_scenario(SimConfig(**SMALL, spec_host_s=1e-3), 1, modes, et, lone))
    free = by_name(run_scenario(SimConfig(**SMALL, async_baseline=False, spec_host_s=0.0), 1,
                                modes, et, lone))
    # one rank: no bubble, so the modes differ by their per-forward charges only
    base_ratio = charged["none"].step_time_s / free["none"].step_time_s
    assert base_ratio < 1.0  # the async credit
    fixed = et.t_fixed
    assert charged["none"].step_time_s < free["none"].step_time_s * (fixed - et.t_host * 0.9) / fixed
    # the spec host charge: slower by about 1 ms per forward than with no charge
    per_fwd = ((charged["useless"].step_time_s - free["useless"].step_time_s)
               / charged["useless"].cp_decode_steps)
    assert per_fwd == pytest.approx(1e-3, rel=0.05)
    # a mode's own measured host time wins over the default
    assert charged["useless_own_host"].step_time_s == pytest.approx(
        free["useless"].step_time_s, rel=1e-9)
    assert charged["useless"].speedup < 0.85 < free["useless"].speedup


def test_speedup_is_monotone_in_acceptance(et):
    accs = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
    modes = [ModeSpec("none", 0, 0)] + [ModeSpec(f"a{a}", a, 4.0) for a in accs]
    modes += [ModeSpec(f"p{a}", 0.5, 4.0, True, a, 4.0) for a in accs]
    for r in (8, 32):
        rows = by_name(run_scenario(SimConfig(**SMALL), r, modes, et, SHORT))
        for prefix in ("a", "p"):
            sp = [rows[f"{prefix}{a}"].speedup for a in accs]
            assert all(x <= y + 1e-12 for x, y in itertools.pairwise(sp)), (prefix, sp)


def test_deterministic_under_seed(et):
    a = run_scenario(SimConfig(**SMALL, seed=7), 16, default_modes(), et, SHORT)
    b = run_scenario(SimConfig(**SMALL, seed=7), 16, default_modes(), et, SHORT)
    c = run_scenario(SimConfig(**SMALL, seed=8), 16, default_modes(), et, SHORT)
    assert [s.row() for s in a] == [s.row() for s in b]
    assert [s.row() for s in a] != [s.row() for s in c]


def test_pregen_only_in_pregen_modes_and_shares_are_fractions(et):
    rows = by_name(run_scenario(SimConfig(**SMALL), 16, default_modes(), et, SHORT))
    assert rows["bubblespec"].coverage > 0 and rows["suffix"].coverage == 0
    for s in rows.values():
        assert 0 <= s.bubble_fraction < 1 and 0 <= s.pregen_bubble_share <= 1 + 1e-9
        assert 0 <= s.coverage <= 1


BENCH = {"config": {"ranks": 64, "prompts_per_rank": 2, "samples": 8, "draft_tokens": 512},
         "summary": {"calls_per_s": 1117.0, "daemon_cpu_per_wall": 0.51, "fetch_burst_s": 0.08,
                     "stop_latency_p99_s": 0.083}}


def test_the_control_plane_is_charged_to_pre_generating_modes_and_grows_with_the_ranks(et):
    cp = ControlPlane.from_bench(BENCH)
    assert cp.fetch_tokens_per_s == pytest.approx(64 * 2 * 8 * 512 / 0.08)
    assert cp.load(64) == pytest.approx(0.51) and cp.load(1024) == pytest.approx(16 * 0.51)
    assert cp.stop_s(64) == pytest.approx(0.083) and cp.stop_s(1024) > 0.083
    free = by_name(run_scenario(SimConfig(**SMALL), 16, default_modes(), et, SHORT))
    shares = {}
    for ranks in (16, 256):
        rows = by_name(run_scenario(SimConfig(**SMALL, control_plane=cp), ranks,
                                    default_modes(), et, SHORT))
        assert rows["suffix"].control_plane_s == 0 and rows["bubblespec"].control_plane_s > 0
        shares[ranks] = rows["bubblespec"].control_plane_s / rows["bubblespec"].step_time_s
        if ranks == 16:  # the same draws: only the charge differs
            assert rows["suffix"].step_time_s == free["suffix"].step_time_s
            assert rows["bubblespec"].step_time_s == pytest.approx(
                free["bubblespec"].step_time_s + rows["bubblespec"].control_plane_s)
    assert shares[256] > shares[16]
    assert all(s.control_plane_s == 0 for s in free.values())


def test_drafts_served_by_their_ranks_take_the_bytes_off_the_daemon(et):
    peers = {"config": {**BENCH["config"], "procs": 2, "drafts_from": "peers"},
             "summary": {**BENCH["summary"], "locate_s_per_draft": 5e-6}}
    one, cp = ControlPlane.from_bench(BENCH), ControlPlane.from_bench(peers)
    assert cp.peer_tokens_per_s == pytest.approx(64 * 2 * 8 * 512 / 2 / 0.08)
    # the daemon's part per draft (queued by its load), plus each rank's own share served
    # by that rank: the burst no longer grows with every rank's bytes through one process
    tokens, drafts = 1024 * 128 * 2000.0, 1024 * 128
    assert cp.fetch_s(tokens, 1024, drafts) == pytest.approx(
        drafts * 5e-6 * cp.load(1024) + tokens / 1024 / cp.peer_tokens_per_s)
    assert cp.fetch_s(tokens, 1024, drafts) < one.fetch_s(tokens, 1024, drafts) / 10
    rows = by_name(run_scenario(SimConfig(**SMALL, control_plane=cp), 256, default_modes(),
                                et, SHORT))
    base = by_name(run_scenario(SimConfig(**SMALL, control_plane=one), 256, default_modes(),
                                et, SHORT))
    assert 0 < rows["bubblespec"].control_plane_s < base["bubblespec"].control_plane_s


def test_a_ranks_push_pattern_loads_the_daemon_per_step_not_per_bench_second():
    rank = {"config": {**BENCH["config"], "procs": 2, "lane_tokens_per_s": 100.0},
            "summary": {**BENCH["summary"], "calls_per_rank_step": 6.0,
                        "heartbeats_per_rank_s": 0.5}}
    cp = ControlPlane.from_bench(rank)
    per_call = 0.51 / 1117.0
    assert cp.load(1024, 100.0) == pytest.approx(1024 * (6.0 / 100.0 + 0.5) * per_call)
    assert cp.load(1024, 10.0) > cp.load(1024, 100.0)  # shorter steps: more calls a second
    assert cp.load(1024) == pytest.approx(ControlPlane.from_bench(BENCH).load(1024))
    # the stress pattern's pushes follow the bench's seconds: its record ignores the step
    stress = ControlPlane.from_bench({**BENCH, "summary": rank["summary"]})
    assert stress.calls_per_rank_step is None
    assert stress.load(1024, 100.0) == stress.load(1024)


def test_synthetic_lengths_have_the_stated_shape():
    rng = np.random.default_rng(0)
    x = LengthSource.default(max_new_tokens=10**9).sample(rng, 20000, 4)
    ratio = np.percentile(x, 99) / np.median(x)
    assert 5.4 < ratio < 6.6 and 1900 < np.median(x) < 2100
    logs = np.log(x)
    corr = np.corrcoef(logs[:, 0], logs[:, 1])[0, 1]
    assert 0.45 < corr < 0.55


def test_length_files(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "a.json").write_text(json.dumps([5, 6, 7]))
    (tmp_path / "b.json").write_text(json.dumps({"by_prompt": [[10, 11], [1000, 1001]]}))
    a = LengthSource.from_json(tmp_path / "a.json", scale=2.0).sample(rng, 10, 3)
    assert set(np.unique(a)) <= {10, 12, 14}
    b = LengthSource.from_json(tmp_path / "b.json").sample(rng, 50, 4)
    assert np.all((b.max(axis=1) < 20) | (b.min(axis=1) > 900))  # siblings stay together
    (tmp_path / "c.json").write_text(json.dumps({"x": 1}))
    with pytest.raises(ValueError):
        LengthSource.from_json(tmp_path / "c.json")


def test_lpt_balances_better_than_round_robin_with_an_oracle():
    rng = np.random.default_rng(1)
    L = rng.lognormal(7, 1, size=(64, 4))
    loads = [np.bincount(assign_prompts(L, 8, how, 0.0), weights=L.sum(1), minlength=8)
             for how in ("round_robin", "lpt")]
    assert loads[1].max() <= loads[0].max()


def test_accept_json_and_mode_flags(tmp_path):
    p = tmp_path / "acc.json"
    p.write_text(json.dumps({"nospec": {"accepted_per_forward": 0},
                             "suffix": {"accepted_per_forward": 0.8, "drafted_per_forward": 3},
                             "bubblespec": {"tokens_per_forward": 2.5, "pregen_coverage": 0.5}}))
    modes, notes = load_accept_json(p)
    m = {x.name: x for x in modes}
    assert modes[0].name == "nospec" and m["nospec"].is_baseline
    bs = m["bubblespec"]
    assert bs.uses_pregen and bs.accepted == pytest.approx(0.8)
    # harmonic mixing reproduces the overall figure
    mix = 0.5 / (1 + bs.accepted_covered) + 0.5 / (1 + bs.accepted)
    assert 1 / mix - 1 == pytest.approx(1.5)
    assert any("suffix" in n for n in notes)
    assert solve_covered(1.0, 1.0, 0.2) == pytest.approx(1.0)
    rows = tmp_path / "rows.json"  # bench/engine_bench.py rows
    rows.write_text(json.dumps([{"mode": "nospec", "accepted_per_forward": 0.0},
                                {"mode": "bubblespec_siblings", "accepted_per_forward": 0.4},
                                {"mode": "bubblespec_pregen", "accepted_per_forward": 2.0}]))
    m2 = {x.name: x for x in load_accept_json(rows)[0]}
    assert not m2["bubblespec_siblings"].uses_pregen and m2["bubblespec_pregen"].uses_pregen
    assert m2["bubblespec_pregen"].accepted == pytest.approx(0.4)
    assert m2["bubblespec_pregen"].accepted_covered == pytest.approx(2.0)
    # the modes' recorded draft sources (core.sources names) decide over their names
    srcs = tmp_path / "sources.json"
    srcs.write_text(json.dumps({"nospec": {"accepted_per_forward": 0.0},
                                "bubblespec-live": {"accepted_per_forward": 0.5,
                                                    "sources": ["siblings", "global"]},
                                "mine": {"accepted_per_forward": 1.0, "pregen_coverage": 0.5,
                                         "sources": "pregen,siblings"}}))
    m3 = {x.name: x for x in load_accept_json(srcs)[0]}
    assert not m3["bubblespec-live"].uses_pregen and m3["mine"].uses_pregen
    f = parse_mode_flag("mine=pregen:2/5,0.5/2")
    assert (f.accepted_covered, f.drafted_covered, f.accepted, f.drafted) == (2, 5, 0.5, 2)
    merged = merge_modes(default_modes(), [f, parse_mode_flag("suffix=1/3")])
    assert next(x.name for x in merged) == "none" and {x.name: x for x in merged}[
        "suffix"].accepted == 1
    for bad in ("x=1", "x=2/1", "x=pregen:1/2"):
        with pytest.raises(ValueError):
            parse_mode_flag(bad)


def test_the_spec_async_what_if_hides_a_speculative_modes_host_work(et):
    """`spec_async`: a speculative mode's forwards cost what the baseline's do when its
    drafts are useless, the host work hidden under the forward."""
    modes = [ModeSpec("none", 0, 0), ModeSpec("useless", 0, 0, True, 0, 0)]
    lone = LengthSource.default(median=300, max_new_tokens=3000)
    rows = by_name(run_scenario(SimConfig(**SMALL, spec_async=True, spec_host_s=1e-3), 1,
                                modes, et, lone))
    assert rows["useless"].speedup == pytest.approx(1.0, rel=0.01)
    serial = by_name(run_scenario(SimConfig(**SMALL, spec_host_s=1e-3), 1, modes, et, lone))
    assert serial["useless"].speedup < 0.85
