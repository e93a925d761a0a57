"""The reference batch step (bubblespec.core.batch.step) is the engine proposer's
per-request loop as it was before the batch step existed: the loop below, transcribed from
the proposer (its `propose` body after the request lookup, and its `_choose`), must give the
same drafts, request states, calibration and per-source counters on random RL-like batches."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from bubblespec.core import SuffixIndex
from bubblespec.core.batch import Request, follow_aligned, step
from bubblespec.core.candidates import Candidate, aligned_candidate, choose
from tests.core.batch_cases import Case, batch_case, drive


def previous_loop(index: Any, reqs: list, sampled: list, num_tokens: list, k: int,
                  max_model_len: int, params: Any, calib: Any, src: Any, *,
                  extend_index: bool, keep_out: bool, drafts: Any) -> list[list[int]]:
    out: list[list[int]] = []
    for i, new in enumerate(sampled):
        st = reqs[i]
        n_tok = int(num_tokens[i])
        if not new:
            out.append([])
            continue
        c = st.counters
        c.steps += 1
        if keep_out:
            st.out.extend(new)
        if st.last_draft:
            acc = len(new) - 1
            c.accepted += acc
            if st.last_src:
                if st.last_src == "aligned":
                    c.accepted_pregen += acc
                calib.record(st.last_src, st.last_claim, st.last_draft, acc)
                src.accepted[st.last_src] += acc
        if extend_index:
            index.extend_sequence(st.seq_id, new)
        budget = min(k, max_model_len - n_tok - 1)
        aligned = follow_aligned(st, new, budget)
        if drafts is not None:
            tokens = list(drafts[i])[:max(budget, 0)]
            st.matcher.extend(new)
        else:
            cands = [aligned_candidate(aligned, calib.aligned_rate())] if aligned else []
            for name, m in (("group", st.matcher), ("global", st.gmatcher)):
                if m is None:
                    continue
                if budget > 0:
                    d = m.speculate(new, params)
                    cands.append(Candidate(name, d.token_ids, d.probs))
                else:
                    m.extend(new)
            best, claim = choose(cands, budget, calib)
            if best is None:
                st.last_src, st.last_claim = "", 0.0
                src.empty += 1
                tokens = []
            else:
                st.last_src, st.last_claim = best.source, claim
                src.wins[best.source] += 1
                src.drafted[best.source] += len(best.token_ids)
                tokens = best.token_ids
        st.last_draft = len(tokens)
        if tokens:
            c.drafts += 1
            c.draft_tokens += len(tokens)
        out.append(tokens)
    return out


@settings(max_examples=60, deadline=None)
@given(batch_case())
def test_reference_step_is_the_previous_proposer_loop(case: Case) -> None:
    seed = case.rnd.random()
    logs = []
    for fn in (previous_loop, step):
        case.rnd.seed(seed)
        logs.append(drive(SuffixIndex, Request, fn, case))
    assert logs[1] == logs[0]
    # every source takes part somewhere across the examples; a step's counters add up
    for out, states, (_, _, _, _, src), _ in logs[0]:
        assert len(out) == len(states)
        assert src["empty"] + sum(src[f"{s}_wins"] for s in ("aligned", "group", "global")) \
            <= sum(st[0].steps for st in states)
