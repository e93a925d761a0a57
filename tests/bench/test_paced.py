"""Pure figures of the paced bench: modelled throughput, speed-ups against the right
baseline, crit/longest with its confidence interval, overrun validity, the final line, the
keyed baseline modes and the CLI's flags."""

from __future__ import annotations

import math

import pytest

from bubblespec.bench.modes import ALL_MODES, baseline_of, mode_by_name
from bubblespec.bench.paced_figures import (
    format_cost_table,
    format_paced_table,
    mean_ci,
    mode_summary,
    paced_final_line,
    per_step_lines,
    position_lines,
    speedups,
)
from bubblespec.cli.bench import build_parser


def _step(i: int, tokens: int, wall: float, crit: int, longest: int) -> dict:
    return {"step": i, "completion_tokens": tokens, "wall_s": wall,
            "decode_steps_critical": crit, "max_len": longest, "bubble_fraction": 0.2,
            "pregen_tokens": 10, "window_pregen_tokens": 5, "accepted_pregen_tokens": 4,
            "accepted_tokens": 30, "draft_tokens": 60, "tokens_per_forward": 1.0}


def _run(seed_mode: str, walls: list[float], forwards: int = 1000, overruns: int = 0,
         crit: int = 100) -> dict:
    return {"seed_mode": seed_mode, "totals": {"steps": len(walls) - 1},
            "steps": [_step(i, 1000, w, crit, 200) for i, w in enumerate(walls)],
            "cluster": {"pace": {"forwards": forwards, "overruns": overruns,
                                 "worst_ratio": 0.7},
                        "memory": {"peak_total_mib": 4096.0, "peak_per_rank_mib": 500.0}}}


def test_summary_uses_modelled_seconds_after_step_0() -> None:
    s = mode_summary([_run("default", [99.0, 10.0, 30.0])], scale=10.0)
    assert s["steps"] == 2 and s["completion_tokens"] == 2000
    assert s["modelled_rollout_s"] == pytest.approx(4.0)
    assert s["throughput_tok_s"] == pytest.approx(500.0)
    assert s["crit_per_longest_mean"] == pytest.approx(0.5)
    assert s["crit_per_longest_ci95"] == pytest.approx(0.0)
    assert s["pregen_tokens"] == 30 and s["acceptance"] == pytest.approx(0.5)
    assert s["valid"] and s["peak_rss_mib"] == 4096.0


def test_each_run_is_modelled_at_its_own_pace_scale() -> None:
    slow = {**_run("default", [99.0, 40.0, 120.0]), "pace_scale": 40.0}
    s = mode_summary([slow, _run("default", [1.0, 10.0, 30.0])], scale=10.0)
    assert s["modelled_rollout_s"] == pytest.approx(4.0 + 4.0)  # 160 / 40 + 40 / 10
    assert s["pace_scale"] == 40.0
    assert mode_summary([_run("default", [1.0, 10.0])], scale=10.0)["pace_scale"] == 10.0
    lines = per_step_lines({0: {"nospec": _run("default", [10.0, 20.0]), "bubblespec": slow}},
                           10.0)
    assert "2.00 s" in lines[3] and "1.00 s" in lines[3]  # step 1: 20 / 10 and 40 / 40
    assert "3.00 s" in lines[4]  # 120 / 40
    assert " 40 " in format_paced_table({"bubblespec": s}, {"bubblespec": 1.0})


def test_drafting_share_is_the_proposers_time_over_the_ranks_modelled_time() -> None:
    run = _run("keyed", [1, 1])
    assert mode_summary([run], 1.0)["drafting_share"] is None  # an older run: not recorded
    run["cluster"]["pace"].update(modelled_s=200.0, drafting_s=5.0, charged_s=5.0)
    s = mode_summary([run, run], 1.0)
    assert s["drafting_share"] == pytest.approx(0.025) and s["drafting_charged"]
    assert "2.5" in format_paced_table({"keyed": s}, {"keyed": 1.0})
    run["cluster"]["pace"]["charged_s"] = 0.0
    absorbed = format_paced_table({"keyed": mode_summary([run], 1.0)}, {"keyed": 1.0})
    assert "2.5 (absorbed)" in absorbed


def test_overruns_of_one_percent_invalidate_a_mode() -> None:
    assert not mode_summary([_run("default", [1, 1], overruns=10)], 1.0)["valid"]
    assert mode_summary([_run("default", [1, 1], overruns=9)], 1.0)["valid"]
    # two seeds: counters add up
    two = mode_summary([_run("default", [1, 1], overruns=9)] * 2, 1.0)
    assert (two["forwards"], two["overruns"], two["runs"]) == (2000, 18, 2)


def test_speedups_against_nospec_or_keyed_baseline() -> None:
    results = {"nospec": _run("default", [0, 40.0]),
               "nospec-keyed": _run("keyed", [0, 20.0]),
               "bubblespec": _run("default", [0, 20.0]),
               "bubblespec-keyed": _run("keyed", [0, 5.0]),
               "suffix": {"skipped": "x"}}
    summ = {k: mode_summary([v], 10.0) for k, v in results.items() if v.get("steps")}
    assert baseline_of("bubblespec-keyed", results) == "nospec-keyed"
    sp = speedups(summ, results)
    assert sp["bubblespec"] == pytest.approx(2.0)
    assert sp["bubblespec-keyed"] == pytest.approx(4.0)
    assert sp["nospec"] == pytest.approx(1.0)
    line = paced_final_line(sp)
    assert line == ("paced_rollout_speedup_vs_nospec: bubblespec=2.00 suffix=n/a ngram=n/a "
                    "history=n/a keyed=4.00 suffix_keyed=n/a keyed_window=n/a "
                    "keyed_branch=n/a keyed_window_branch=n/a keyed_stream=n/a "
                    "keyed_window_stream=n/a")
    # modes outside the fixed list follow it when measured (baselines never)
    more = paced_final_line({**sp, "bubblespec-keyed-spread-deep": 1.5, "nospec-keyed": 1.0})
    assert more == line + " keyed_spread_deep=1.50"
    table = format_paced_table(summ, sp)
    assert "4.00x" in table and "0/1000" in table
    lines = per_step_lines({0: results}, 10.0)
    assert lines[0].startswith("seed 0") and "100/200" in lines[2]


def test_mean_ci() -> None:
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.30 * 1.0 / math.sqrt(3))
    assert mean_ci([1.0])[1] == math.inf


def test_keyed_baseline_modes() -> None:
    for name, spec in (("ngram-keyed", "ngram"), ("suffix-keyed", "suffix"),
                       ("history-keyed", "bubblespec")):
        m = mode_by_name([name])[0]
        assert m.seed_mode == "keyed" and not m.pregen
        assert f"--spec-mode={spec}" in m.rank_args
    assert len({m.name for m in ALL_MODES}) == len(ALL_MODES)


def test_cli_flags() -> None:
    a = build_parser().parse_args(["paced", "--pace", "h200", "--seeds", "0,1,2"])
    assert (a.ranks, a.pace, a.epoch_steps, a.seeds) == (8, "h200", 0, "0,1,2")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["paced", "--pace", "a100"])


def test_mode_scales_flag_and_groups(tmp_path, capsys) -> None:
    from bubblespec.bench.paced import PacedBenchConfig, scale_text, scaled_groups
    from bubblespec.cli.bench import main

    a = build_parser().parse_args(["paced", "--mode-scale", "bubblespec=400,suffix=300"])
    assert a.mode_scales == "bubblespec=400,suffix=300"
    cfg = PacedBenchConfig(
        steps=2, prompts=2, n=2, seeds="0", epoch_steps=0, lr=1e-4, temperature=1.0,
        greedy_prompts=0, modes="nospec,nospec-keyed,bubblespec,suffix", ranks=2, pace="h100",
        pace_scale=150.0, kv_cache_mib=64, train_window_s=1.0, extra_rank_args="",
        model=None, out=str(tmp_path), timeline_step=1, mode_scales=a.mode_scales)
    assert (cfg.scale_of("nospec"), cfg.scale_of("bubblespec"), cfg.scale_of("suffix")) == (
        150.0, 400.0, 300.0)
    assert "--pace-scale=400.0" in cfg.service_config(0, 400.0).extra_rank_args
    assert "--pace-scale=150.0" in cfg.service_config(0).extra_rank_args
    assert scale_text(cfg) == "150 (bubblespec x400, suffix x300)"
    groups = scaled_groups(mode_by_name(cfg.modes.split(",")), cfg)
    assert [[m.name for m in g] for g in groups] == [["nospec", "nospec-keyed"],
                                                     ["bubblespec"], ["suffix"]]
    # two stateless modes at different scales cannot share a cluster's paced ranks
    split = PacedBenchConfig(**{**cfg.__dict__, "mode_scales": "nospec-keyed=300"})
    assert [[m.name for m in g] for g in scaled_groups(
        mode_by_name(["nospec", "nospec-keyed"]), split)] == [["nospec"], ["nospec-keyed"]]
    for bad in ("bubblespec", "bubblespec=0", "bubblespec=fast", "=3"):
        with pytest.raises(ValueError, match="--mode-scale"):
            PacedBenchConfig(**{**cfg.__dict__, "mode_scales": bad}).scales()
    rc = main(["paced", "--modes", "nospec", "--mode-scale", "sufix=300",
               "--out", str(tmp_path)])
    assert rc == 2  # a misspelt mode: refused before anything starts
    assert "--mode-scale: unknown mode 'sufix'" in capsys.readouterr().err
    # a known mode outside --modes (a default scale table) is noted, not refused: here the
    # refusal is --steps's
    rc = main(["paced", "--modes", "nospec", "--mode-scale", "suffix=300", "--steps", "1",
               "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "--mode-scale for suffix: not in --modes" in err and "--steps" in err


def test_cluster_groups_share_only_stateless_engines() -> None:
    from bubblespec.bench.paced import ALL_FRESH_MODES, REPEATS_MODES, cluster_groups

    modes = mode_by_name(ALL_FRESH_MODES.split(","))
    groups = [[m.name for m in g] for g in cluster_groups(modes)]
    # bubblespec's global pool (on by default) keeps responses: each mode its own cluster
    assert groups == [["nospec", "nospec-keyed"], ["bubblespec"], ["bubblespec-keyed"],
                      ["bubblespec-keyed-window"], ["suffix-keyed"], ["suffix"],
                      ["ngram", "ngram-keyed"]]
    pool_off = cluster_groups(mode_by_name(["bubblespec", "bubblespec-keyed"]),
                              "--sources=pregen,siblings,self")
    assert [[m.name for m in g] for g in pool_off] == [["bubblespec", "bubblespec-keyed"]]
    rep = [[m.name for m in g] for g in cluster_groups(mode_by_name(REPEATS_MODES.split(",")))]
    assert rep == [["nospec", "nospec-keyed"], ["history"], ["history-keyed"],
                   ["bubblespec-history"], ["bubblespec-keyed-history"]]
    # extra rank arguments that keep state across steps: every mode on its own cluster
    alone = cluster_groups(mode_by_name(["nospec", "nospec-keyed"]), "--sources=global")
    assert [len(g) for g in alone] == [1, 1]
    # the same rank arguments but another synchronizer (pre-gen order): its own cluster
    order = cluster_groups(mode_by_name(["bubblespec-keyed-spread", "bubblespec-keyed-spread-deep",
                                         "bubblespec-keyed"]))
    assert [[m.name for m in g] for g in order] == [
        ["bubblespec-keyed-spread"], ["bubblespec-keyed-spread-deep"], ["bubblespec-keyed"]]
    assert order[1][0].sync_args == ("--pregen-depth=8",)


def test_branch_counters_read_a_ranks_metrics_exposition() -> None:
    """The paced record's branch figures come from the rank's own Prometheus registry:
    the names the bench reads are the ones the rank exports."""
    from prometheus_client import generate_latest

    from bubblespec.bench.paced import branch_counters
    from bubblespec.metrics.rank import new_rank_metrics

    m = new_rank_metrics("r0")
    assert branch_counters(generate_latest(m.registry).decode()) == {
        "made": 0.0, "tokens": 0.0, "streamed": 0.0}
    m.pregen_branches.labels("r0").inc(3)
    m.pregen_branch_tokens.labels("r0").inc(41)
    m.pregen_offers_streamed.labels("r0").inc(2)
    m.pregen_tokens.labels("r0").inc(500)  # every pre-generated token: not the branches'
    assert branch_counters(generate_latest(m.registry).decode()) == {
        "made": 3.0, "tokens": 41.0, "streamed": 2.0}


def test_accept_doc_for_the_simulator() -> None:
    from bubblespec.bench.paced_figures import accept_doc

    run = _run("keyed", [1, 1, 1])
    for s in run["steps"]:
        s["tokens_per_forward"] = 2.0
    run["pregen"] = True
    doc = accept_doc({"bubblespec-keyed": run, "suffix": {"skipped": "x"}})
    row = doc["bubblespec-keyed"]
    assert row["accepted_per_forward"] == pytest.approx(1.0)
    assert row["drafted_per_forward"] == pytest.approx(120 / 1000)
    assert row["pregen_coverage"] == pytest.approx(8 / 2000)
    assert list(doc) == ["bubblespec-keyed"]


def test_accept_doc_feeds_the_simulator(tmp_path) -> None:
    import json

    from bubblespec.bench.paced_figures import accept_doc
    from bubblespec.sim.policy import load_accept_json

    base, suffix, keyed = (_run("keyed", [1, 1, 1]) for _ in range(3))
    for s in suffix["steps"]:
        s["tokens_per_forward"] = 1.5
    for s in keyed["steps"]:
        s["tokens_per_forward"] = 2.0
    keyed["pregen"] = True
    keyed["sources"] = ["pregen", "siblings", "self", "global", "global_live"]
    live = {**keyed, "sources": ["siblings", "self"]}  # hands prompts ahead, drafts no pregen
    doc = accept_doc({"nospec-keyed": base, "suffix-keyed": suffix, "bubblespec-keyed": keyed,
                      "bubblespec-live": live})
    assert doc["bubblespec-keyed"]["sources"] == keyed["sources"]
    assert not doc["bubblespec-live"]["uses_pregen"] and "pregen_coverage" not in doc[
        "bubblespec-live"]
    del doc["bubblespec-live"]
    assert list(doc) == ["nospec", "suffix-keyed", "bubblespec-keyed"]
    path = tmp_path / "accept.json"
    path.write_text(json.dumps(doc))
    modes, notes = load_accept_json(path)
    by = {m.name: m for m in modes}
    assert by["nospec"].is_baseline
    assert by["bubblespec-keyed"].uses_pregen
    assert by["bubblespec-keyed"].accepted == pytest.approx(0.5)  # uncovered: suffix-keyed's
    assert any("'suffix-keyed'" in n for n in notes)


def test_position_lines_pool_the_pre_generating_modes_after_step_0() -> None:
    rows = [{"positions": "0-31", "exposed": 30, "flips": 1, "ran_out": 0},
            {"positions": "32-127", "exposed": 10, "flips": 0, "ran_out": 2}]
    ent = {"by_position": [{"positions": "0-31", "tokens": 30, "mean": 0.5},
                           {"positions": "32-127", "tokens": 10, "mean": 0.25}]}
    steps = [{"step": k, "positions": rows, "entropy": ent} for k in range(3)]
    lines = position_lines({"nospec-keyed": {"pregen": False, "steps": steps},
                            "bubblespec-keyed": {"pregen": True, "steps": steps}})
    assert lines[0] == "bubblespec-keyed:" and len(lines) == 4  # name, header, two classes
    first = lines[2].split()
    assert first[:4] == ["0-31", "60", "2", "0"]  # steps 1 and 2 only
    assert float(first[4]) == pytest.approx(1 - 2 / 60, abs=1e-4) and float(first[5]) == 0.5
    assert position_lines({"bubblespec-keyed": {"pregen": True, "steps": [{"step": 0}]}}) == []


def test_cost_split_adds_up_to_the_modelled_seconds() -> None:
    """forward + drafting charged + keyed host + keyed device - async hidden = modelled; the
    uncharged share is the drafting a rank did not charge."""
    run = _run("keyed", [1, 1])
    assert mode_summary([run], 1.0)["cost_split"] is None  # an older record
    run["cluster"]["pace"].update(modelled_s=100.0, forward_s=90.0, drafting_s=4.0,
                                  charged_s=3.0, product_host_s=2.0, keyed_device_s=6.0,
                                  async_hidden_s=1.0, between_s=0.5)
    c = mode_summary([run, run], 1.0)["cost_split"]
    assert c["modelled_s"] == pytest.approx(200.0)
    assert c["forward_share"] + c["charged_share"] + c["product_host_share"] + \
        c["keyed_device_share"] - c["async_hidden_share"] == pytest.approx(1.0)
    assert c["uncharged_host_share"] == pytest.approx(0.01)
    assert c["between_share"] == pytest.approx(0.005)  # part of the keyed host share
    table = format_cost_table({"bubblespec-keyed": mode_summary([run], 1.0)})
    assert "bubblespec-keyed" in table and "6.00" in table and "1.00" in table
    assert format_cost_table({"old": mode_summary([_run("keyed", [1, 1])], 1.0)}) == ""
