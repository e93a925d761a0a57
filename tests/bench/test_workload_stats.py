"""`bubblespec bench workload-stats`: each figure on inputs whose answer is known (entropy of a
known distribution, longest common substrings by brute force, sibling-draft replays of
identical and of unrelated siblings, source counters), and the command on two documents
shaped like `bench engine --out`'s."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from bubblespec.bench.workload_stats import (
    entropy_stats,
    lcs_ratio,
    longest_common_substring,
    replay_sibling_drafts,
    source_acceptance,
    workload_stats,
)
from bubblespec.cli.bench import main


def test_entropy_estimate_matches_the_distribution() -> None:
    p = np.array([0.5, 0.25, 0.125, 0.125])
    entropy = -float(np.sum(p * np.log(p)))
    rng = np.random.default_rng(0)
    logprobs = [np.log(p[rng.choice(4, size=200, p=p)]).tolist() for _ in range(50)]
    e = entropy_stats(logprobs)
    assert e["nats_per_token"] == pytest.approx(entropy, abs=0.02)
    assert e["tokens"] == 10_000 and e["near_certain_share"] == 0.0
    certain = entropy_stats([[0.0, -0.01, np.log(0.95)], [-3.0]])
    assert certain["near_certain_share"] == 0.75


def _brute_lcs(a: list[int], b: list[int]) -> int:
    return max((n for i in range(len(a)) for n in range(1, len(a) - i + 1)
                if any(a[i:i + n] == b[j:j + n] for j in range(len(b) - n + 1))), default=0)


def test_longest_common_substring_against_brute_force() -> None:
    rng = random.Random(1)
    for _ in range(60):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 12))]
        b = [rng.randrange(3) for _ in range(rng.randrange(0, 12))]
        assert longest_common_substring(a, b) == _brute_lcs(a, b)
    assert lcs_ratio([[[1, 2, 3, 4], [9, 2, 3, 8]]]) == 0.5


def test_replay_identical_siblings_accept_most_tokens() -> None:
    rng = random.Random(2)
    resp = [rng.randrange(1000) for _ in range(200)]
    same = replay_sibling_drafts([[resp, list(resp), list(resp)]], k=8)
    assert same["tokens_per_forward"] > 5 and same["accepted_share"] > 0.8


def test_replay_unrelated_siblings_accept_nothing() -> None:
    rng = random.Random(3)
    group = [[rng.randrange(10**6) for _ in range(100)] for _ in range(4)]
    r = replay_sibling_drafts([group], k=8)
    assert r["tokens_per_forward"] == 1.0 and r["accepted_share"] == 0.0


def test_source_acceptance_from_counters() -> None:
    rows = [{"mode": "nospec"},
            {"mode": "bubblespec_pregen", "sources": {
                "aligned_wins": 5, "aligned_drafted": 40, "aligned_accepted": 30,
                "group_wins": 2, "group_drafted": 20, "group_accepted": 10,
                "global_wins": 0, "global_drafted": 0, "global_accepted": 0, "empty": 3}}]
    fig = source_acceptance(rows)["bubblespec_pregen"]
    assert fig["aligned_acceptance"] == 0.75 and fig["group_acceptance"] == 0.5
    assert fig["global_acceptance"] is None and fig["aligned_share"] == 0.75


def _doc(task: str, seed: int, copy: float) -> dict:
    """An engine-bench document: 3 prompts x 4 responses, siblings copying each other with
    probability `copy` per token."""
    rng = random.Random(seed)
    groups = []
    for _ in range(3):
        first = [rng.randrange(50) for _ in range(rng.randrange(20, 60))]
        group = [[t if rng.random() < copy else rng.randrange(50) for t in first]
                 for _ in range(4)]
        groups.append([{"ids": g, "logprobs": [-rng.random() for _ in g]} for g in group])
    src = {f"{s}_{c}": 4 for s in ("aligned", "group", "global")
           for c in ("wins", "drafted", "accepted")}
    rows = [{"mode": "nospec", "steps": 100, "tokens": 100, "tokens_per_forward": 1.0},
            {"mode": "bubblespec_siblings", "steps": 80, "tokens": 104,
             "tokens_per_forward": 1.3, "sources": src}]
    return {"config": {"task": task, "prompts": 3, "n": 4}, "model": f"/m/{task}",
            "b0": {"responses": groups, "mean_reward": 0.5}, "rows": rows}


def test_workload_stats_of_a_document() -> None:
    alike, apart = workload_stats(_doc("a", 0, 0.95)), workload_stats(_doc("b", 0, 0.3))
    assert alike["workload"] == "a: 3 prompts x n=4" and alike["model"] == "a"
    assert alike["siblings"]["lcs_ratio"] > apart["siblings"]["lcs_ratio"]
    assert (alike["replay"]["tokens_per_forward"]
            > apart["replay"]["tokens_per_forward"] >= 1.0)
    assert alike["tokens_per_forward"] == {"nospec": 1.0, "bubblespec_siblings": 1.3}
    assert alike["reductions"]["bubblespec_siblings"] == pytest.approx(1 - 80 / 104)
    with pytest.raises(ValueError, match="--out"):
        workload_stats({"rows": [{"mode": "nospec"}]})


def test_command_prints_workloads_side_by_side(tmp_path: Path, capsys) -> None:
    paths = []
    for task, copy in (("addchain", 0.9), ("wordproblems", 0.4)):
        paths.append(tmp_path / f"{task}.json")
        paths[-1].write_text(json.dumps(_doc(task, 1, copy)))
    out = tmp_path / "stats.json"
    assert main(["workload-stats", *map(str, paths), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("workload"))
    assert "addchain: 3 prompts x n=4" in line and "wordproblems: 3 prompts x n=4" in line
    assert "entropy per token" in text and "bubblespec_siblings: aligned" in text
    assert len(json.loads(out.read_text())) == 2
    assert main(["workload-stats", str(tmp_path / "missing.json")]) == 2


def test_engine_bench_document_feeds_the_stats(tmp_path: Path) -> None:
    """The engine bench's own writers (`responses`, `save`) give a document the stats read."""
    from bubblespec.bench.engine import responses, save
    from bubblespec.engine.types import GenResult, SampleResult
    from bubblespec.protocol.sample import SampleMeta

    def sample(i: int, ids: list[int]) -> SampleResult:
        return SampleResult(ids, [-0.5] * len(ids), i, SampleMeta(
            finish_reason="stop", completion_tokens=len(ids), decode_steps=len(ids)))

    results = [GenResult(f"g{g}", [sample(i, [g, 5, 6, 7, 8, 9, 2]) for i in range(3)])
               for g in range(2)]
    path = tmp_path / "engine.json"
    save(str(path), {"config": {"task": "addchain", "prompts": 2, "n": 3}, "model": "/m/tiny",
                     "b0": {"responses": responses(results), "mean_reward": 0.25},
                     "rows": [{"mode": "nospec", "steps": 42, "tokens": 42,
                               "tokens_per_forward": 1.0}]})
    save("", {})  # no path: nothing written
    stats = workload_stats(json.loads(path.read_text()))
    assert stats["length"]["median"] == 7 and stats["siblings"]["identical"] == 1.0
    assert stats["entropy"]["nats_per_token"] == pytest.approx(0.5)
    assert stats["replay"]["accepted_share"] > 0.5
