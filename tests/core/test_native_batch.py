"""The batch step (one engine step of the proposer for every running request): the native
``step`` against the pure-Python reference in bubblespec.core.batch. Random RL-like batches
(sibling requests decoding live, pre-generated responses that are aligned, diverge and
re-join, a global pool, budgets running out near the model length, partial prefills, drafts
given from outside, appends deferred after the step) must give identical drafts, identical per-request state, identical
calibration and per-source counters at every step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from bubblespec.core import DraftParams
from bubblespec.core.backend import implementations, load_native
from bubblespec.core.candidates import Calibration, DrafterStats
from tests.core.batch_cases import Case, batch_case, drive

pytestmark = pytest.mark.skipif(load_native() is None, reason="bubblespec_native is not built")


def run(name: str, case: Case) -> list:
    impl = implementations()[name]
    return drive(impl["SuffixIndex"], impl["Request"], impl["step"], case,
                 extend=impl["extend_requests"])


@settings(max_examples=80, deadline=None)
@given(batch_case())
def test_batch_step_agrees(case: Case) -> None:
    seed = case.rnd.random()
    logs = []
    for name in ("python", "native"):
        case.rnd.seed(seed)
        logs.append(run(name, case))
    assert logs[1] == logs[0]


def test_errors_match() -> None:
    """Bad lengths, unknown or finished sequences, bad tokens and a request listed twice
    fail alike (the native step checks its whole input before changing anything)."""
    for impl in implementations().values():
        idx = impl["SuffixIndex"](max_depth=4)
        cal, src = Calibration(), DrafterStats()
        p = DraftParams()
        with pytest.raises(ValueError):
            impl["step"](idx, [], [[1]], [5], 4, 100, p, cal, src)
        idx.add_sequence("a", 0, [1, 2, 3, 1, 2], live=True)
        idx.add_sequence("b", 0, [1, 2])
        ra = impl["Request"](0, "a", idx.matcher(0, [1, 2, 3, 1, 2]))
        rb = impl["Request"](0, "b", idx.matcher(0, [1, 2]))
        rc = impl["Request"](0, "c", idx.matcher(0, [1, 2]))
        assert impl["step"](idx, [ra], [[3]], [8], 4, 100, p, cal, src) != [[]]
        for reqs, sampled in (([ra, rb], [[1], [3]]), ([rc], [[1]]), ([ra], [[-1]]),
                              ([ra, ra], [[1], [2]])):
            with pytest.raises(ValueError):
                impl["step"](idx, reqs, sampled, [9] * len(reqs), 4, 100, p, cal, src)
        with pytest.raises(ValueError):
            impl["step"](idx, [ra], [[1]], [9], 4, 100, p, cal, src, drafts=[])


def test_extend_sequences_is_extend_sequence_in_order_checked_whole() -> None:
    """The deferred appends: one call equals extend_sequence per pair in order (a sequence
    named twice included), on a thread beside other work too (the native index appends
    without the GIL); a bad name or a finished sequence fails before anything changes."""
    from concurrent.futures import ThreadPoolExecutor

    seqs = {("s", i): [i % 3, 1, 2, i % 5] for i in range(12)}
    adds = [(("s", i), [(i + j) % 7 for j in range(1 + i % 4)]) for i in range(12)]
    adds.append((("s", 3), [6, 6, 1]))
    counts = []
    for impl in implementations().values():
        idx = impl["SuffixIndex"](max_depth=6)
        for sid, toks in seqs.items():
            idx.add_sequence(sid, sid[1] % 3, toks, live=True, to_global=sid[1] % 2 == 0)
        idx.add_sequence("done", 0, [1, 2])
        for bad in ([("s", 0), "nope"], [("s", 1), "done"]):
            with pytest.raises(ValueError):
                idx.extend_sequences(bad, [[1], [2]])
        with pytest.raises(ValueError):
            idx.extend_sequences([("s", 0)], [[1], [2]])
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(idx.extend_sequences, [a[0] for a in adds], [a[1] for a in adds])
            busy = sum(i * i for i in range(20_000))  # the caller goes on meanwhile
            job.result()
        assert busy > 0
        counts.append([idx.sequence_tokens(sid) for sid in seqs]
                      + [idx.num_tokens, idx.num_global_tokens]
                      + [idx.count(g, [1, 2]) for g in range(3)]
                      + [idx.count(None, [6, 6])])
    assert counts[0] == counts[1]
    assert counts[0][3] == seqs[("s", 3)] + adds[3][1] + [6, 6, 1]


def test_extend_requests_appends_what_a_step_left() -> None:
    """A step with extend_index=False, then extend_requests: the request's live sequences
    hold what they emitted (empty lists skipped), in both implementations alike; a request
    missing for a sampled list or a finished sequence fails before anything changes."""
    got = []
    for impl in implementations().values():
        idx = impl["SuffixIndex"](max_depth=4)
        cal, src, p = Calibration(), DrafterStats(), DraftParams()
        reqs = []
        for sid in ("a", "b", "c"):
            idx.add_sequence(sid, 0, [1, 2], live=True)
            reqs.append(impl["Request"](0, sid, idx.matcher(0, [1, 2])))
        sampled = [[3, 1], [], [2]]
        impl["step"](idx, reqs, sampled, [4, 2, 3], 4, 100, p, cal, src, extend_index=False)
        assert idx.sequence_tokens("a") == [1, 2]
        impl["extend_requests"](idx, reqs, sampled)
        with pytest.raises(ValueError):
            impl["extend_requests"](idx, reqs[:2], sampled)
        idx.finish_sequence("c")
        with pytest.raises(ValueError):
            impl["extend_requests"](idx, reqs, [[1], [1], [1]])
        got.append([idx.sequence_tokens(s) for s in "abc"] + [idx.num_tokens])
    assert got[0] == [[1, 2, 3, 1], [1, 2], [1, 2, 2], 9]
    assert all(g == got[0] for g in got)
