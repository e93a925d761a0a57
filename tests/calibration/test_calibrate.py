"""The paced-run reader, its derived inputs, the replay and the comparison (`--calibrate`).

The fixture `bubblespec/calibration/data/paced_small.json` (shipped as predict's default) is cut from the first valid paced 8-rank run (h100 x 30,
16 prompts x n=8, 3 steps): six of its modes, with only the step fields the calibration
reads (prompt keys shortened)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblespec.bench.paced_record import PacedRun
from bubblespec.calibration.predict import DEFAULT_CALIBRATION
from bubblespec.calibration.replay import (
    Counts,
    assignment_check,
    assignments,
    pooled_spec,
    replay,
    replay_all,
    spec_of,
)
from bubblespec.calibration.report import compare, load, scenario
from bubblespec.cli.simulate import main
from bubblespec.sim.run import project

FIXTURE = DEFAULT_CALIBRATION


@pytest.fixture(scope="module")
def paced() -> tuple[PacedRun, dict, float]:
    return load(FIXTURE)


def test_reads_the_run(paced):
    run, first, window = paced
    assert (run.ranks, run.prompts, run.n, run.steps, run.pace, run.scale) == (
        8, 16, 8, 3, "h100", 30.0)
    assert window == 2.0
    assert run.modes["bubblespec-keyed-window"].window
    assert not run.modes["bubblespec-keyed"].window
    assert run.modes["bubblespec-keyed"].baseline == "nospec-keyed"
    assert run.modes["suffix"].baseline == "nospec"
    assert run.lengths("nospec").shape == (3, 16, 8)
    assert run.prompt_len(first) == pytest.approx(3088 / 49)  # prefill per prompt
    assert run.train_s("bubblespec-keyed-window") == pytest.approx(2.03, abs=0.01)


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(schema="other"), "schema"),
    (lambda d: d["config"].pop("pace"), "config.pace"),
    (lambda d: d["runs"]["0"]["nospec"]["steps"][1].update(output_lengths=[[1, 2]]),
     "runs.nospec.steps[1].output_lengths"),
    (lambda d: d.update(runs={}), "runs"),
])
def test_bad_files_name_the_field(tmp_path, edit, field):
    doc = json.loads(FIXTURE.read_text())
    edit(doc)
    path = tmp_path / "paced.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        PacedRun.load(path)


def test_assignment_replay_reproduces_the_ranks_without_speculation(paced):
    run, _, _ = paced
    assign = assignments(run)
    assert assignment_check(run, assign) == {"nospec": True, "nospec-keyed": True}
    # fresh prompts on a fresh gateway: round robin; the second mode of a cluster is
    # balanced by the first mode's lengths of the same prompts
    assert assign["nospec"][0].tolist() == [p % 8 for p in range(16)]
    assert assign["nospec-keyed"][0].tolist() != assign["nospec"][0].tolist()
    assert np.all(np.bincount(assign["nospec-keyed"][1], minlength=8) >= 1)


def test_specs_reproduce_the_measured_forwards_and_drafts():
    c = Counts(tokens=10_000, accepted=6_000, drafted=9_000, fetched=8_000)
    unc = Counts(tokens=5_000, accepted=1_000, drafted=4_500, fetched=0)
    plain = spec_of("suffix", c, False, False, None, "test")
    assert plain.accepted == pytest.approx(6_000 / 4_000)
    assert plain.drafted == pytest.approx(9_000 / 4_000)
    s = spec_of("bubblespec", c, True, True, unc, "test")
    assert s.uses_pregen and s.pregen_window
    assert s.accepted == pytest.approx(1_000 / 4_000)
    f_c = 0.8 * c.tokens / (1 + s.accepted_covered)
    f_u = 0.2 * c.tokens / (1 + s.accepted)
    assert f_c + f_u == pytest.approx(c.forwards)  # the measured forwards of requests
    assert f_c * s.drafted_covered + f_u * s.drafted == pytest.approx(c.drafted)


def test_replay_of_modes_without_speculation_is_the_paced_model(paced):
    run, first, _ = paced
    rep = replay(run, first)
    for name in ("nospec", "nospec-keyed"):
        for raw, sim in zip(run.modes[name].steps, rep[name].steps):
            assert sim.cp_forwards == raw["decode_steps_critical"]
            assert sim.rank_forwards == [raw["rank_decode_steps"][f"r{r}"] for r in range(8)]
            if raw["step"] > 0:  # step 0 carries the first rollout's start-up
                assert sim.rollout_time_s == pytest.approx(raw["wall_s"] / run.scale,
                                                           rel=0.01)
    assert rep["nospec"].measured_speedup == 1.0 and rep["nospec"].modelled_speedup == 1.0
    assert rep["suffix"].modelled_speedup == pytest.approx(rep["suffix"].summary.speedup)
    win = rep["bubblespec-keyed-window"]
    assert win.steps[0].pregen_tokens > rep["bubblespec-keyed"].steps[0].pregen_tokens
    assert win.steps[0].stop_lag_s < 0.05  # the window itself is not a lag
    assert pooled_spec(run, "bubblespec-keyed-window").pregen_window


def test_comparison_lines_and_document(paced):
    run, first, _ = paced
    lines, doc = compare(run, first)
    last = lines[-1]
    assert last.startswith("sim_vs_paced_gap: bubblespec=")
    assert "keyed_window=" in last and "suffix=" in last and "(within 10%:" in last
    assert doc["gap_line"] == last
    assert doc["assignment_check"] == {"nospec": True, "nospec-keyed": True}
    for name, m in doc["modes"].items():
        assert m["measured_speedup"] > 0 and m["modelled_speedup"] > 0, name
    assert any("forwards per rank" in x for x in lines)


def test_projection_from_calibrated_inputs(paced):
    run, first, window = paced
    s = scenario(run, first, window, [8, 32], 3, 0)
    assert s.cfg.prompts_per_rank == 2 and s.cfg.n == 8 and s.cfg.train_s == 2.0
    assert next(m.name for m in s.modes) == "nospec"
    assert "nospec-keyed" not in [m.name for m in s.modes]
    rows = {(r.ranks, r.mode): r for r in project(s).results}
    assert rows[(32, "nospec")].speedup == 1.0
    assert rows[(32, "bubblespec-keyed")].speedup > rows[(32, "suffix")].speedup > 1.0


def test_cli(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--calibrate", str(FIXTURE), "--ranks", "8", "--steps", "3",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out.strip().splitlines()
    assert text[-1].startswith("sim_vs_paced_gap: ")
    assert any(x.startswith("[modelled]") for x in text)
    assert json.loads((out / "calibrate.json").read_text())["gap_line"] == text[-1]
    assert main(["--calibrate", str(tmp_path / "missing.json")]) == 2
    assert "error" in capsys.readouterr().err


def test_covered_spread_slows_only_the_pre_generating_modes(paced):
    run, first, _ = paced
    uniform = replay(run, first)
    spread = [replay(run, first, cover_cv=0.5, seed=k) for k in range(4)]
    for name in ("nospec-keyed", "suffix"):
        assert all(r[name].modelled_speedup == uniform[name].modelled_speedup for r in spread)
    mean = np.mean([r["bubblespec-keyed-window"].modelled_speedup for r in spread])
    assert mean < uniform["bubblespec-keyed-window"].modelled_speedup
    lines, _ = compare(run, first, cover_cv=0.5, draws=2)
    assert any("sensitivity (assumed, not measured)" in x for x in lines)
    assert lines[-1].startswith("sim_vs_paced_gap: ")


def test_seeds_are_summed_as_the_bench_sums_them(tmp_path):
    doc = json.loads(FIXTURE.read_text())
    plain = {k: v for k, v in doc["runs"]["0"].items() if v["seed_mode"] != "keyed"}
    doc["runs"]["1"] = json.loads(json.dumps(plain))
    path = tmp_path / "paced.json"
    path.write_text(json.dumps(doc))
    one, two = replay_all(FIXTURE), replay_all(path)
    assert PacedRun.load(path, "1").modes.keys() == plain.keys()
    assert two["suffix"].measured == (2 * one["suffix"].measured[0],
                                      2 * one["suffix"].measured[1])
    for name in ("suffix", "bubblespec", "bubblespec-keyed"):
        assert two[name].measured_speedup == pytest.approx(one[name].measured_speedup)
        assert two[name].modelled_speedup == pytest.approx(one[name].modelled_speedup)
    with pytest.raises(ValueError, match=r"runs\.7 missing"):
        PacedRun.load(path, "7")
    lines, _ = compare(PacedRun.load(path), doc["runs"]["0"])
    assert "2 seeds" in lines[0]


def test_a_keyed_only_run(tmp_path):
    doc = json.loads(FIXTURE.read_text())
    for name in ("nospec", "bubblespec", "suffix"):
        doc["runs"]["0"].pop(name)
    doc["runs"]["0"]["nospec-keyed"]["cluster"] = {"pace": {"prefill_tokens": 3088}}
    doc["runs"]["0"]["suffix"] = {"skipped": "arctic_inference not importable"}
    path = tmp_path / "paced.json"
    path.write_text(json.dumps(doc))
    run, first, window = load(path)
    assert set(run.modes) == {"nospec-keyed", "bubblespec-keyed", "bubblespec-keyed-window"}
    lines, _ = compare(run, first)
    assert lines[-1].startswith("sim_vs_paced_gap: keyed=")
    assert "(within 10%:" in lines[-1] and "bubblespec=" not in lines[-1]
    s = scenario(run, first, window, [8], 3, 0)
    assert [m.name for m in s.modes] == list(run.modes)


CHARGED = "docs/data/paced_r64_ahead3_charged.json"  # every cost charged (issue 56)


def test_a_charged_run_replays_with_its_own_charges():
    """The record's pace counters give each mode's charges: the async-scheduled baseline
    replays its measured seconds step by step, the speculative mode pays its measured host
    time per forward; without the charges the replay flatters speculation by a third."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / CHARGED
    run, first, _ = load(path)
    base, spec = run.modes["nospec-keyed"], run.modes["bubblespec-keyed-ahead3"]
    assert base.async_host and not spec.async_host
    pace = first["bubblespec-keyed-ahead3"]["cluster"]["pace"]
    assert spec.host_s == pytest.approx((pace["charged_s"] + pace["product_host_s"])
                                        / pace["forwards"])
    rep = replay(run, first)
    for raw, sim in list(zip(base.steps, rep["nospec-keyed"].steps))[1:]:
        assert sim.rollout_time_s == pytest.approx(raw["wall_s"] / run.scale, rel=0.02)
    charged = rep["bubblespec-keyed-ahead3"]
    assert abs(charged.modelled_speedup / charged.measured_speedup - 1) < 0.10
    # the same replay with the charges off (the simulator before issue 56's charges)
    for m in run.modes.values():
        m.async_host, m.host_s = False, 0.0
    free = replay(run, first)["bubblespec-keyed-ahead3"]
    assert free.modelled_speedup > 1.25 * free.measured_speedup


def test_a_record_without_pace_counters_leaves_the_charges_to_the_simulator(paced):
    run, _, _ = paced
    assert all(m.host_s is None and not m.async_host for m in run.modes.values())
