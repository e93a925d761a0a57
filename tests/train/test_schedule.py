"""The GRPO schedule's own seeds (`schedule_seeds`): what makes every mode of a benchmark
sample with the same seeds whatever step number the gateway is at."""

from __future__ import annotations

from bubblespec.protocol.keys import SEED_LIMIT, derive_seeds
from bubblespec.train.schedule import schedule_seeds


def test_seeds_are_a_pure_function_of_run_step_position_and_sample() -> None:
    a = schedule_seeds(7, 3, 4, 8)
    assert a == schedule_seeds(7, 3, 4, 8)
    assert len(a) == 4 and all(len(row) == 8 for row in a)
    assert all(0 <= s < SEED_LIMIT for row in a for s in row)
    assert a[2] == derive_seeds(7, 3, "p2", 8)


def test_seeds_differ_between_steps_positions_samples_and_runs() -> None:
    a = schedule_seeds(7, 3, 4, 8)
    flat = [s for row in a for s in row]
    assert len(set(flat)) == len(flat)
    assert not set(flat) & {s for row in schedule_seeds(7, 4, 4, 8) for s in row}
    assert not set(flat) & {s for row in schedule_seeds(8, 3, 4, 8) for s in row}


def test_a_prefix_of_the_batch_keeps_its_seeds() -> None:
    """Seeds follow the prompt's position and sample index, not the batch size or n."""
    big, small = schedule_seeds(1, 0, 6, 8), schedule_seeds(1, 0, 2, 4)
    assert [row[:4] for row in big[:2]] == small


def _sample(n: int, steps: int, acc: int, div: int | None, after: int, rec: int = 0,
            ran_out: bool | None = None) -> dict:
    return {"output_ids": [1] * n, "decode_steps": steps, "num_accepted_tokens": acc,
            "first_divergence": div, "draft_ran_out": ran_out,
            "num_accepted_after_divergence": after, "num_recouplings": rec}


def test_divergence_figures_split_accepted_tokens_at_the_first_divergence() -> None:
    from bubblespec.train.schedule import divergence_figures

    d = divergence_figures([_sample(100, 20, 80, None, 0),  # followed its draft
                            _sample(120, 70, 50, 40, 20, rec=1, ran_out=True),  # critical
                            {"output_ids": [1] * 30, "decode_steps": 30}])  # no counters
    assert (d["responses"], d["diverged"], d["recouplings"], d["ran_out"]) == (3, 1, 1, 1)
    assert (d["accepted_before"], d["accepted_after"], d["tail_tokens"]) == (110, 20, 80)
    assert d["tail_accepted_share"] == 20 / 80
    c = d["critical"]
    assert (c["tokens"], c["decode_steps"], c["first_divergence"]) == (120, 70, 40)
    assert c["draft_ran_out"] is True
    assert (c["accepted_before"], c["accepted_after"], c["tail_accepted_share"]) == (30, 20, 0.25)
    assert divergence_figures([])["critical"] is None
    assert divergence_figures([_sample(10, 10, 0, None, 0)])["tail_accepted_share"] is None


def test_paced_summary_pools_the_critical_tails_over_steps() -> None:
    from bubblespec.bench.paced_figures import divergence_lines, divergence_summary
    from bubblespec.train.schedule import divergence_figures

    steps = [{"divergence": divergence_figures([_sample(100, 60, 40, 20, 30, ran_out=True),
                                                _sample(50, 10, 40, None, 0)])},
             {"divergence": divergence_figures([_sample(100, 80, 10, 60, 10)])}]
    d = divergence_summary(steps)
    assert (d["diverged"], d["accepted_after"], d["tail_tokens"]) == (2, 40, 120)
    assert d["crit_first_divergence"] == [20, 60] and d["crit_diverged"] == 2
    assert d["crit_tail_accepted_share"] == 40 / 120
    assert (d["ran_out"], d["crit_ran_out"]) == (1, 1)
    assert divergence_summary([{"wall_s": 1.0}]) is None
    line, = divergence_lines({"keyed": {"divergence": d}, "nospec": {"divergence": None}})
    assert line.startswith("keyed: 2/3 responses left") and "33% of 120 tail tokens" in line
    assert "(1 where it ended" in line and "2 diverged (1 at the draft's end)" in line


def test_request_figures_group_per_prompt() -> None:
    from bubblespec.protocol.gateway import PromptResult, RolloutSample
    from bubblespec.train.schedule import request_figures

    prompts = [PromptResult(index=0, prompt_key="a", rank_id="r1", input_ids=[1],
                            samples=[RolloutSample(sample_index=0, output_ids=[5, 6],
                                                   decode_steps=2, num_accepted_pregen_tokens=1,
                                                   first_divergence=1, draft_ran_out=False,
                                                   num_accepted_after_divergence=1),
                                     RolloutSample(sample_index=1, output_ids=[5],
                                                   decode_steps=1)])]
    f = request_figures(prompts)
    assert f == {"request_decode_steps": [[2, 1]], "request_accepted_pregen": [[1, 0]],
                 "request_first_divergence": [[1, None]],
                 "request_draft_ran_out": [[False, None]],
                 "request_accepted_after": [[1, 0]], "prompt_ranks": ["r1"]}
