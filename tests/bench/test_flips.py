"""`bench flips`: the pure figures on hand-made rows, and the keyed decoder on the embedded
model (its tokens are the keyed reference's; a branch continues at the right positions; no
update means no flip)."""

from __future__ import annotations

import numpy as np
import pytest

from bubblespec.bench.flips import (
    Decoded,
    branch_cost,
    budget_figures,
    first_below,
    first_divergence,
    flip_row,
    stream_figures,
    summary,
)


def _draft(tokens: list[int], margins: list[float], runner_ups: list[int]) -> Decoded:
    return Decoded(tokens, margins, runner_ups, [0.0] * len(tokens))


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_flip_row_ranks_the_flip_margin_and_checks_the_runner_up() -> None:
    d = _draft([5, 6, 7, 8], [0.9, 0.1, 0.5, 0.05], [1, 9, 2, 3])
    row = flip_row(d, [5, 9, 4, 4, 4])
    assert row["first_divergence"] == 1 and row["runner_up_hit"]
    assert row["margin_rank"] == 1  # only position 3 has a smaller margin
    assert row["tail"] == 3
    miss = flip_row(d, [5, 6, 1, 1])
    assert not miss["runner_up_hit"] and miss["margin_rank"] == 2
    same = flip_row(d, [5, 6, 7, 8])
    assert same["margin_rank"] is None and same["tail"] == 0


def test_budget_figures_count_only_flips_inside_the_budget() -> None:
    rows = [{"margin_rank": 0, "runner_up_hit": True, "tail": 10, "branch_match": 10,
             "relative_position": 0.1},
            {"margin_rank": 3, "runner_up_hit": True, "tail": 10, "branch_match": 4,
             "relative_position": 0.5},
            {"margin_rank": 0, "runner_up_hit": False, "tail": 20, "relative_position": 0.9},
            {"margin_rank": None, "runner_up_hit": False, "tail": 0}]
    f = budget_figures(rows, {1: 5, 4: 20}, 100, budgets=(1, 4))
    assert f["1"] == {"covered": 1, "tail_share": 10 / 40, "cost_share": 0.05}
    assert f["4"]["covered"] == 2 and f["4"]["tail_share"] == 14 / 40
    s = summary(rows)
    assert (s["diverged"], s["runner_up_hits"], s["branch_whole_tail"]) == (3, 2, 1)


def test_streamed_offers_branch_at_the_first_margin_below_the_threshold() -> None:
    margins = [0.5, 0.02, 0.3, 0.005] + [1.0] * 6
    assert first_below(margins, (0.001, 0.01, 0.1)) == {"0.001": None, "0.01": 3, "0.1": 1}
    d = _draft(list(range(10)), margins, [90 + p for p in range(10)])
    # the new response flips to the runner-up at position 3 (the smallest margin)
    flip = flip_row(d, [0, 1, 2, 93, 7, 7, 7])
    flip["branch_match"] = 3
    same = flip_row(_draft([1] * 8, [0.2] * 8, [0] * 8), [1] * 8)
    f = stream_figures([flip, same], (0.001, 0.01, 0.1))
    # no margin below 0.001: the complete draft offers its smallest margin, which was the flip
    assert f["0.001"]["covered"] == 1 and f["0.001"]["streamed"] == 0
    assert f["0.001"]["cost_share"] == (6 + 7) / 18  # each draft's tail after its minimum
    # below 0.01: streamed at 3, 7 tokens before the draft's end
    assert (f["0.01"]["covered"], f["0.01"]["streamed"], f["0.01"]["earlier_by"]) == (1, 1, 7)
    assert f["0.01"]["tail_share"] == 1.0 and f["0.01"]["drafts_streaming"] == 0.5
    # below 0.1 the stream spends the one branch on position 1: the flip is missed
    assert f["0.1"]["covered"] == 0 and f["0.1"]["tail_share"] == 0
    assert f["0.1"]["cost_share"] == (8 + 7) / 18


def test_branch_cost_takes_the_lowest_margins() -> None:
    d = _draft([1] * 10, [0.5, 0.01, 0.3, 0.02] + [1.0] * 6, [0] * 10)
    assert branch_cost(d, 1) == 8  # position 1: 8 tokens after it
    assert branch_cost(d, 2) == 8 + 6


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from bubblespec.tasks import default_model_dir, default_task

    model = AutoModelForCausalLM.from_pretrained(str(default_model_dir()))
    model.eval()
    return model, default_task()


def test_keyed_decode_is_the_reference_sampler_and_branches_continue_in_place(tiny) -> None:
    import torch

    from bubblespec.bench.flips import keyed_decode
    from bubblespec.core.keyed_noise import keyed_sample_of_key, position_key

    model, task = tiny
    prompt = list(task.make_prompts(1, 5)[0].input_ids)
    rows = keyed_decode(model, prompt, [11, 12], 0, 80, task.eos_id)
    assert rows[0].tokens != rows[1].tokens
    d = rows[0]
    with torch.no_grad():  # no cache: every position recomputed from the full sequence
        logits = model(input_ids=torch.tensor([prompt + d.tokens])).logits[0].double().numpy()
    for t, tok in enumerate(d.tokens):
        assert tok == keyed_sample_of_key(logits[len(prompt) + t - 1], position_key(11, t))
    # the chosen token as the "branch": the continuation is the draft's own tail
    f = len(d.tokens) // 2
    cont = keyed_decode(model, prompt + d.tokens[: f + 1], [11], f + 1, 80 - f - 1,
                        task.eos_id)[0]
    assert cont.tokens == d.tokens[f + 1:]
    assert np.allclose(cont.margins, d.margins[f + 1:], atol=1e-4)  # float32 prefill vs cache


def test_no_update_no_flip_and_a_large_update_flips(tiny) -> None:
    from bubblespec.bench.flips import run_flips
    from bubblespec.tasks import default_model_dir

    _, task = tiny
    kw = {"steps": 1, "prompts": 2, "n": 4, "seed": 1, "max_new": 96, "log": lambda _: None}
    same = run_flips(task, str(default_model_dir()), lr=0.0, **kw)
    assert same["summary"]["responses"] == 8 and same["summary"]["diverged"] == 0
    moved = run_flips(task, str(default_model_dir()), lr=3e-2, **kw)
    s = moved["summary"]
    assert s["diverged"] > 0
    assert all("branch_match" in r for r in moved["rows"] if r["runner_up_hit"])


class _FlatReward:
    """The task with every response rewarded the same: every GRPO advantage is 0."""

    def __init__(self, task) -> None:
        self._task = task

    def __getattr__(self, name: str):
        return getattr(self._task, name)

    def reward(self, prompt, tokens) -> float:
        return 1.0


def test_an_update_on_no_sample_is_refused_not_compared(tiny) -> None:
    from bubblespec.bench.flips import EmptyUpdate, run_flips
    from bubblespec.tasks import default_model_dir

    _, task = tiny
    kw = {"steps": 1, "prompts": 1, "n": 2, "seed": 1, "max_new": 8, "log": lambda _: None}
    with pytest.raises(EmptyUpdate, match="trained on 0 samples"):
        run_flips(_FlatReward(task), str(default_model_dir()), lr=1e-3, **kw)
    # no learning rate: the same weights on purpose (the no-update control), still compared
    doc = run_flips(_FlatReward(task), str(default_model_dir()), lr=0.0, **kw)
    assert doc["summary"]["responses"] == 2 and doc["summary"]["diverged"] == 0


def test_context_keyed_decode_is_the_reference_sampler(tiny) -> None:
    import torch

    from bubblespec.bench.flips import keyed_decode
    from bubblespec.core.context_keys import response_keys
    from bubblespec.core.keyed_noise import keyed_sample_of_key

    model, task = tiny
    prompt = list(task.make_prompts(1, 6)[0].input_ids)
    d = keyed_decode(model, prompt, [21], 0, 80, task.eos_id, by_context=True)[0]
    pos = keyed_decode(model, prompt, [21], 0, 80, task.eos_id)[0]
    assert d.tokens != pos.tokens  # other keys, other noise
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + d.tokens])).logits[0].double().numpy()
    keys = response_keys(21, prompt, d.tokens, extra=0)
    for t, tok in enumerate(d.tokens):
        assert tok == keyed_sample_of_key(logits[len(prompt) + t - 1], keys[t])
    with pytest.raises(ValueError):
        keyed_decode(model, prompt, [21], 3, 10, task.eos_id, by_context=True)


def test_context_keys_measure_coupling_without_branches(tiny) -> None:
    from bubblespec.bench.flips import format_report, run_flips
    from bubblespec.tasks import default_model_dir

    _, task = tiny
    doc = run_flips(task, str(default_model_dir()), steps=1, prompts=2, n=4, seed=1,
                    max_new=96, lr=3e-2, log=lambda _: None, by_context=True)
    assert doc["summary"]["diverged"] > 0 and doc["config"]["seed_mode"] == "keyed_context"
    assert not any("branch_match" in r for r in doc["rows"])
    c = doc["coupling"]["all"]
    assert c["responses"] == 8 and 0 < c["predicted"] < c["tokens"]
    assert sum(r["follow"]["predicted"] for r in doc["rows"]) == c["predicted"]
    last = format_report(doc)[-1]
    assert last.startswith("flips: ") and "keys=context" in last and "own_tail=" in last


def test_rows_of_different_prompts_in_one_batch_decode_as_alone(tiny) -> None:
    from bubblespec.bench.flips import decode_rows, keyed_decode

    model, task = tiny
    a, b = (list(p.input_ids) for p in task.make_prompts(2, 7))
    b = b + [b[-1]] * 3  # lengths differ: the shorter row is left-padded
    for by_context in (False, True):
        rows = decode_rows(model, [a, b, a], [5, 6, 7], [0, 0, 0], [60, 40, 60],
                           task.eos_id, by_context=by_context)
        alone = [keyed_decode(model, p, [s], 0, m, task.eos_id, by_context=by_context)[0]
                 for p, s, m in ((a, 5, 60), (b, 6, 40), (a, 7, 60))]
        assert [r.tokens for r in rows] == [x.tokens for x in alone]
        assert len(rows[1].tokens) <= 40
        for r, x in zip(rows, alone):
            assert np.allclose(r.margins, x.margins, atol=1e-3)
