"""Pure parts of `bubblespec bench service`: per-step figures, totals, the reduction formula, the
final line and the JSON shape (no cluster)."""

from __future__ import annotations

import json

import pytest

from bubblespec.bench.modes import (
    MODES,
    BenchDoc,
    final_line,
    format_table,
    greedy_agreement,
    keyed_agreement,
    lengths_doc,
    mode_by_name,
    rank_sources,
    reduction,
    reductions,
    reward_agreement,
    totals,
)
from bubblespec.core.sources import DEFAULT_SOURCES
from bubblespec.train.schedule import step_figures


def rollout(crit: int, total: int, tokens: int, tpf: float, lens=((3, 5), (2,)),
            pregen_acc: int = 0, drafts: int = 0, acc: int = 0) -> dict:
    return {
        "counters": {"decode_steps_critical": crit, "decode_steps_total": total,
                     "completion_tokens": tokens, "tokens_per_forward": tpf,
                     "num_draft_tokens": drafts, "num_accepted_tokens": acc,
                     "num_accepted_pregen_tokens": pregen_acc},
        "ranks": [{"rank_id": "r0", "decode_steps": crit}, {"rank_id": "r1", "decode_steps": 1}],
        "prompts": [{"samples": [{"output_ids": [1] * n, "decode_steps": n} for n in ls]}
                    for ls in lens],
    }


REPORT = {"pregen_tokens": 40, "bubble_fraction": 0.25,
          "ranks": [{"rank_id": "r0", "busy_s": 3.0, "bubble_s": 0.0, "pregen_s": 0.0,
                     "idle_s": 0.0, "bubble_fraction": 0.0},
                    {"rank_id": "r1", "busy_s": 1.0, "bubble_s": 2.0, "pregen_s": 1.5,
                     "idle_s": 0.5, "bubble_fraction": 2 / 3}]}


def steps_of(crits, tpf=1.0, rewards=None):
    rewards = rewards or [0.5] * len(crits)
    return [dict(step_figures(rollout(c, c + 2, 10, tpf), REPORT, 1.0, r), step=i)
            for i, (c, r) in enumerate(zip(crits, rewards))]


def test_step_figures_uses_rank_forward_passes():
    f = step_figures(rollout(7, 9, 10, 2.0, drafts=8, acc=6, pregen_acc=4), REPORT, 1.5, 0.25)
    assert f["decode_steps_critical"] == 7 and f["critical_source"] == "rank_forward_passes"
    assert f["decode_steps_total"] == 9 and f["tokens_per_forward"] == 2.0
    assert f["acceptance"] == 0.75 and f["accepted_pregen_tokens"] == 4
    assert f["pregen_tokens"] == 40 and f["bubble"]["r1"]["pregen_s"] == 1.5
    assert f["rank_decode_steps"] == {"r0": 7, "r1": 1} and f["max_len"] == 5


def test_step_figures_falls_back_to_max_request_steps():
    r = rollout(0, 0, 10, 1.0, lens=((3, 8),))
    f = step_figures(r, None, 1.0, 0.0)
    assert f["decode_steps_critical"] == 8 and f["critical_source"] == "max_request_decode_steps"
    assert f["pregen_tokens"] == 0 and f["bubble"] == {} and f["acceptance"] is None


def test_totals_skip_step_zero():
    t = totals(steps_of([100, 10, 20], rewards=[0.0, 0.5, 1.0]))
    assert t["steps"] == 2 and t["decode_steps_critical"] == 30
    assert t["all_decode_steps_critical"] == 130
    assert t["decode_steps_total"] == 34 and t["completion_tokens"] == 20
    assert t["mean_reward"] == pytest.approx(0.5) and t["reward_sem"] > 0
    assert t["mean_bubble_fraction"] == 0.25
    assert t["longest_response_tokens"] == 10  # max_len 5 per step
    assert t["critical_per_longest"] == pytest.approx(3.0)


def test_totals_tokens_per_forward_is_token_weighted():
    s = steps_of([5, 5, 5])
    s[1]["tokens_per_forward"], s[2]["tokens_per_forward"] = 1.0, 4.0
    s[2]["completion_tokens"] = 40
    t = totals(s)  # forwards: 10/1 + 40/4 = 20; tokens 50
    assert t["tokens_per_forward"] == pytest.approx(2.5)


def test_reduction_formula():
    assert reduction(25, 100) == pytest.approx(0.75)
    assert reduction(100, 100) == 0.0
    assert reduction(120, 100) == pytest.approx(-0.2)
    assert reduction(5, 0) is None


def test_reductions_and_final_line():
    res = {"nospec": {"totals": totals(steps_of([9, 100, 100]))},
           "ngram": {"totals": totals(steps_of([9, 80, 80]))},
           "suffix": {"skipped": "arctic_inference not importable"},
           "bubblespec": {"totals": totals(steps_of([9, 40, 60]))},
           "bubblespec-keyed": {"totals": totals(steps_of([9, 20, 30]))}}
    red = reductions(res)
    assert red["nospec"] == 0.0 and red["ngram"] == pytest.approx(0.2)
    assert red["bubblespec"] == pytest.approx(0.5) and red["suffix"] is None
    line = final_line(red)
    assert line == ("critical_path_decode_step_reduction: bubblespec=0.500 suffix=n/a "
                    "ngram=0.200 history=n/a keyed=0.750 bubblespec_history=n/a "
                    "keyed_history=n/a keyed_window=n/a")
    assert reductions({"ngram": res["ngram"]})["ngram"] is None  # no baseline


def test_greedy_agreement():
    a = [[[1, 2], [1, 2]], [[3]]]
    b = [[[1, 2], [1, 2]], [[4]]]
    g = greedy_agreement({"nospec": a, "ngram": a, "history": b, "suffix": None})
    assert g["reference"] == "nospec" and not g["all_identical"]
    assert g["modes"]["ngram"]["identical"] and g["modes"]["history"]["differing_sequences"] == 1
    assert "suffix" not in g["modes"]
    assert greedy_agreement({}) == {"reference": None, "modes": {}}


def test_reward_agreement_within_noise():
    res = {"nospec": {"totals": totals(steps_of([1, 1, 1, 1], rewards=[0.3, 0.4, 0.5, 0.4]))},
           "bubblespec": {"totals": totals(steps_of([1, 1, 1, 1],
                                                    rewards=[0.35, 0.4, 0.45, 0.42]))},
           "bad": {"totals": totals(steps_of([1, 1, 1, 1], rewards=[0.9, 0.95, 0.9, 0.92]))}}
    r = reward_agreement(res)
    assert r["bubblespec"]["within_noise"] and not r["bad"]["within_noise"]


def test_lengths_doc_groups_by_step_and_prompt():
    steps = [{"step": 0, "prompt_keys": ["a", "b"], "output_lengths": [[3, 4], [5]]},
             {"step": 1, "prompt_keys": ["a"], "output_lengths": [[6, 7]]}]
    d = lengths_doc(steps, "test")
    assert d["by_prompt"] == [[3, 4], [5], [6, 7]] and d["lengths"] == [3, 4, 5, 6, 7]
    assert d["prompt_keys"] == ["s0:a", "s0:b", "s1:a"]


def test_lengths_doc_loads_in_simulator(tmp_path):
    np = pytest.importorskip("numpy")  # noqa: F841
    from bubblespec.sim.workload import LengthSource

    p = tmp_path / "lengths.json"
    p.write_text(json.dumps(lengths_doc(
        [{"step": 0, "prompt_keys": ["a", "b"], "output_lengths": [[3, 4], [5, 9]]}], "t")))
    src = LengthSource.from_json(p)
    assert len(src.groups) == 2


def test_bench_doc_json_shape():
    res = {"nospec": {"steps": steps_of([9, 10]), "totals": totals(steps_of([9, 10]))},
           "suffix": {"skipped": "arctic_inference not importable"}}
    doc = BenchDoc(config={"steps": 2}, modes=res,
                   greedy=greedy_agreement({"nospec": [[[1]]]})).as_dict()
    doc = json.loads(json.dumps(doc))  # JSON-serialisable
    assert doc["schema"] == "bubblespec.bench/v1"
    assert set(doc) >= {"config", "definitions", "modes", "reductions", "greedy_check",
                        "reward_check", "final_line"}
    assert doc["reductions"] == {"nospec": 0.0, "suffix": None}
    assert doc["final_line"].startswith("critical_path_decode_step_reduction: bubblespec=n/a")
    table = format_table(res)
    assert "nospec" in table and "skipped" in table


def test_modes():
    names = [m.name for m in MODES]
    assert names == ["nospec", "nospec-keyed", "ngram", "suffix", "history", "bubblespec", "bubblespec-keyed",
                     "bubblespec-history", "bubblespec-keyed-history", "bubblespec-keyed-window"]
    win = mode_by_name(["bubblespec-keyed-window"])[0]
    assert win.pregen and win.seed_mode == "keyed" and win.pregen_window == "training"
    assert all(m.pregen_window == "bubble" for m in MODES if m is not win)
    both = mode_by_name(["bubblespec-keyed-history"])[0]
    assert both.pregen and both.seed_mode == "keyed" and "history" in both.sources
    assert rank_sources(both.rank_args) == both.sources
    hist = mode_by_name(["history"])[0]
    assert hist.sources == ("history",) and "--sources=history" in hist.rank_args
    assert not hist.pregen
    keyed = mode_by_name(["bubblespec-keyed"])[0]
    assert keyed.pregen and keyed.seed_mode == "keyed" and keyed.key == "keyed"
    plain = mode_by_name(["bubblespec"])[0]
    assert "history" not in plain.sources and rank_sources(plain.rank_args) == DEFAULT_SOURCES
    assert mode_by_name(["nospec"])[0].sources is None
    with pytest.raises(ValueError):
        mode_by_name(["nope"])


def test_keyed_modes_compare_with_keyed_nospec_and_must_match_it_bit_for_bit():
    def mode(crits, hashes, seed_mode="keyed"):
        steps = steps_of(crits)
        for st, h in zip(steps, hashes):
            st["output_ids_sha256"] = h
        return {"seed_mode": seed_mode, "steps": steps, "totals": totals(steps)}

    res = {"nospec": mode([9, 200, 200], ["x", "y", "z"], "default"),
           "nospec-keyed": mode([9, 100, 100], ["a", "b", "c"]),
           "bubblespec-keyed": mode([9, 20, 30], ["a", "b", "c"]),
           "bubblespec-keyed-window": mode([9, 10, 10], ["a", "b", "WRONG"]),
           "bubblespec": mode([9, 50, 50], ["p", "q", "r"], "default")}
    red = reductions(res)
    assert red["bubblespec-keyed"] == pytest.approx(0.75)  # against nospec-keyed
    assert red["bubblespec"] == pytest.approx(0.75)  # against nospec
    assert red["nospec-keyed"] == 0.0
    check = keyed_agreement(res)
    assert set(check) == {"bubblespec-keyed", "bubblespec-keyed-window"}
    assert check["bubblespec-keyed"] == {"identical_steps": 3, "steps": 3, "identical": True}
    assert check["bubblespec-keyed-window"]["identical"] is False
    assert check["bubblespec-keyed-window"]["identical_steps"] == 2
    del res["nospec-keyed"]  # without the keyed baseline: nospec, and no keyed check
    assert reductions(res)["bubblespec-keyed"] == pytest.approx(0.875)
    assert keyed_agreement(res) == {}
