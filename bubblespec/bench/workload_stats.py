"""`bubblespec bench workload-stats`: what makes one workload easier to draft for than another.

    bubblespec bench engine --out out/engine-addchain.json
    bubblespec bench engine --task wordproblems --prompts 8 --n 4 --lr 1e-5 \
        --out out/engine-wordproblems.json
    bubblespec bench workload-stats out/engine-addchain.json out/engine-wordproblems.json

Reads the JSON that `bubblespec bench engine --out` writes (one per workload: the responses
of batch B0, sampled at T=1 with the starting weights, by prompt, with their log-probs, and
every row's counters; a run cut short still has them) and prints, side by side, the figures
that explain why speculation gains more on one workload:

- entropy per token: the mean of -log p(token) over the sampled tokens. At temperature 1 the
  sampled token is drawn from p, so this mean is an unbiased estimate of the per-token
  entropy (nats); also the share of tokens the model was near-certain of (p >= 0.9);
- response lengths: median, mean, p90, p99, max, p99/median;
- sibling similarity: edit similarity, shared-prefix fraction, longest common substring over
  the longer response (pairs of responses to one prompt), and a replay of sibling drafting:
  each response decoded against a suffix index of its complete siblings (the engine's draft
  index, k tokens per draft, greedy acceptance = the draft agrees with the sampled tokens).
  Under plain sampling a drafted token is accepted with probability p(token), the chance that
  sampling draws it, so the replay's acceptance estimates real acceptance; complete siblings
  make it optimistic against the engine's live-sibling source (siblings decode concurrently);
- acceptance per draft source from the engine's own counters (aligned pre-generated response,
  prompt group, global pool: accepted / drafted tokens) and every mode's decode-step
  reduction per generated token against no speculation (all measured on real engines).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from bubblespec.core.draft import DraftParams
from bubblespec.core.sources import DRAFTER_NAMES
from bubblespec.core.suffix_index import SuffixIndex
from bubblespec.tasks.stats import length_stats, sibling_stats

SOURCE_ROWS = ("bubblespec_siblings", "bubblespec_pregen", "bubblespec_pregen_keyed")
"""Engine-bench rows whose per-source counters are shown."""
MODES = ("ngram", "suffix", "bubblespec_siblings", "bubblespec_live", "bubblespec_pregen",
         "bubblespec_all", "bubblespec_pregen_keyed")
NEAR_CERTAIN = float(np.log(0.9))
"""A token is near-certain when its log-probability is at least log 0.9."""


def entropy_stats(logprobs: Sequence[Sequence[float]]) -> dict[str, float]:
    """Mean -log p per sampled token (nats; the per-token entropy estimate at T=1), its
    spread over responses, and the share of near-certain tokens (p >= 0.9)."""
    flat = np.concatenate([np.asarray(lp, dtype=float) for lp in logprobs if len(lp)])
    per_resp = [-float(np.mean(lp)) for lp in logprobs if len(lp)]
    return {"nats_per_token": -float(flat.mean()),
            "response_p10": float(np.percentile(per_resp, 10)),
            "response_p90": float(np.percentile(per_resp, 90)),
            "near_certain_share": float(np.mean(flat >= NEAR_CERTAIN)),
            "tokens": int(flat.size)}


def longest_common_substring(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest run of tokens that occurs in both sequences (O(len a * len b))."""
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def lcs_ratio(groups: Sequence[Sequence[Sequence[int]]]) -> float:
    """Mean over sibling pairs of longest common substring / longer length."""
    ratios = [longest_common_substring(a, b) / max(len(a), len(b), 1)
              for g in groups for a, b in combinations(g, 2)]
    return float(np.mean(ratios)) if ratios else float("nan")


def replay_sibling_drafts(groups: Sequence[Sequence[Sequence[int]]], k: int = 8
                          ) -> dict[str, float]:
    """Decode every response against a suffix index of its siblings' complete responses:
    each forward drafts up to `k` tokens from the longest matching suffix, keeps the prefix
    that agrees with the response, and emits one more token. Returns tokens per forward and
    the share of tokens that came from accepted drafts."""
    params = DraftParams(max_spec_tokens=k)
    tokens = forwards = accepted = 0
    for g in groups:
        for i, resp in enumerate(g):
            index = SuffixIndex()
            for j, sib in enumerate(g):
                if j != i and len(sib):
                    index.add_sequence(j, "siblings", sib)
            pos = 0
            while pos < len(resp):
                draft = index.draft("siblings", resp[:pos], params, use_global=False)
                a = 0
                for d, t in zip(draft.token_ids, resp[pos:]):
                    if d != t:
                        break
                    a += 1
                a = min(a, len(resp) - pos - 1)  # the forward emits one token of its own
                accepted += a
                pos += a + 1
                forwards += 1
            tokens += len(resp)
    return {"tokens_per_forward": tokens / max(forwards, 1),
            "accepted_share": accepted / max(tokens, 1), "k": k}


def source_acceptance(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per bubblespec row of `SOURCE_ROWS`: accepted / drafted tokens of each draft source
    (None where the source drafted nothing) and its share of the row's accepted tokens."""
    out: dict[str, dict[str, float | None]] = {}
    for r in rows:
        src = r.get("sources") or {}
        if r["mode"] not in SOURCE_ROWS or not src:
            continue
        total = sum(src.get(f"{s}_accepted", 0) for s in DRAFTER_NAMES)
        fig: dict[str, float | None] = {}
        for s in DRAFTER_NAMES:
            drafted, acc = src.get(f"{s}_drafted", 0), src.get(f"{s}_accepted", 0)
            fig[f"{s}_acceptance"] = acc / drafted if drafted else None
            fig[f"{s}_share"] = acc / total if total else None
        out[r["mode"]] = fig
    return out


def reductions(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each row's cut in decode steps per generated token against the nospec row (empty
    without it)."""
    by = {r["mode"]: r for r in rows}
    if "nospec" not in by:
        return {}
    base = by["nospec"]["steps"] / max(by["nospec"]["tokens"], 1)
    return {m: 1 - (r["steps"] / max(r["tokens"], 1)) / base for m, r in by.items()}


def workload_stats(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures of one `bench engine --out` document (see the module docstring)."""
    base = doc.get("b0", {}).get("responses")
    if not base:
        raise ValueError("no B0 responses: write one with `bubblespec bench engine --out`")
    groups = [[s["ids"] for s in g] for g in base]
    cfg = doc.get("config", {})
    rows = {r["mode"]: r for r in doc["rows"]}
    return {
        "workload": f"{cfg.get('task', '?')}: {cfg.get('prompts')} prompts x n={cfg.get('n')}",
        "model": Path(doc.get("model", "?")).name,
        "reward_b0": doc["b0"].get("mean_reward"),
        "entropy": entropy_stats([s["logprobs"] for g in base for s in g]),
        "length": length_stats([len(r) for g in groups for r in g]),
        "siblings": {**sibling_stats(groups), "lcs_ratio": lcs_ratio(groups)},
        "replay": replay_sibling_drafts(groups),
        "sources": source_acceptance(doc["rows"]),
        "reductions": reductions(doc["rows"]),
        "tokens_per_forward": {m: rows[m]["tokens_per_forward"] for m in ("nospec", *MODES)
                               if m in rows},
    }


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "n/a"
    if isinstance(v, str):
        return v
    return f"{100 * v:.1f}%" if pct else (f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}")


def table_rows(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines of one workload's figures, in print order."""
    e, ln, sib, rp = stats["entropy"], stats["length"], stats["siblings"], stats["replay"]
    lines = [("workload", stats["workload"]), ("model", stats["model"]),
             ("mean reward (B0, before the update)", _fmt(stats["reward_b0"])),
             ("entropy per token, nats (mean -log p)", _fmt(e["nats_per_token"])),
             ("  per response p10 / p90",
              f"{_fmt(e['response_p10'])} / {_fmt(e['response_p90'])}"),
             ("  near-certain tokens (p >= 0.9)", _fmt(e["near_certain_share"], True)),
             ("response length median / mean", f"{_fmt(ln['median'])} / {_fmt(ln['mean'])}"),
             ("  p90 / p99 / max",
              f"{_fmt(ln['p90'])} / {_fmt(ln['p99'])} / {_fmt(ln['max'])}"),
             ("  p99 / median", _fmt(ln["p99_over_median"])),
             ("siblings: edit similarity", _fmt(sib["similarity"])),
             ("  shared-prefix fraction", _fmt(sib["prefix_fraction"])),
             ("  longest common substring / length", _fmt(sib["lcs_ratio"])),
             ("  identical pairs", _fmt(sib["identical"], True)),
             (f"replayed sibling drafts (k={rp['k']}): tokens/forward",
              _fmt(rp["tokens_per_forward"])),
             ("  tokens from accepted drafts", _fmt(rp["accepted_share"], True))]
    for row, fig in stats["sources"].items():
        for s in DRAFTER_NAMES:
            if fig[f"{s}_acceptance"] is not None:
                acc, share = _fmt(fig[f"{s}_acceptance"], True), _fmt(fig[f"{s}_share"], True)
                lines.append((f"{row}: {s} accepted/drafted (share)", f"{acc} ({share})"))
    for m, v in stats["tokens_per_forward"].items():
        red = stats["reductions"].get(m)
        lines.append((f"engine {m}: tokens/forward (step cut)",
                      _fmt(v) + ("" if m == "nospec" else f" ({_fmt(red, True)})")))
    return lines


def format_side_by_side(all_stats: Sequence[dict[str, Any]]) -> str:
    """One column per workload; a label missing from a workload shows n/a."""
    cols = [dict(table_rows(s)) for s in all_stats]
    labels: list[str] = []
    for s in all_stats:
        labels += [lab for lab, _ in table_rows(s) if lab not in labels]
    width = max(len(lab) for lab in labels) + 2
    cw = max(24, *(len(v) + 2 for c in cols for v in c.values()))
    return "\n".join(f"{lab:<{width}}" + "".join(f"{c.get(lab, 'n/a'):>{cw}}" for c in cols)
                     for lab in labels)


def run(paths: Sequence[str], out: str = "") -> list[dict[str, Any]]:
    """Print the side-by-side table of the given engine-bench JSONs (and write the figures
    to `out` when given)."""
    stats = [workload_stats(json.loads(Path(p).read_text())) for p in paths]
    print(format_side_by_side(stats))
    if out:
        Path(out).write_text(json.dumps(stats, indent=1))
        print(f"wrote {out}")
    return stats
