"""Per-request view of the keyed GRPO schedule: which response sets each step's critical
path, and how far it followed its pre-generated draft.

    bubblespec bench per-request [--steps 5] [--window training] [--seed-mode keyed]
                                 [--out FILE]

Runs the `bubblespec bench service` schedule (its greedy check, then 8 prompts x n=8, T=1.0,
keyed sampling, lr 1e-4, prompt batches repeating every 3 steps) on a fresh 2-rank local
cluster and prints, per step, the requests with the most forward passes: length, forward passes, accepted tokens
and accepted tokens from the aligned pre-generated response. A response that leaves its
draft early shows few pre-gen-accepted tokens and many forward passes.
"""

from __future__ import annotations

import json
from typing import Any


def run_per_request(steps: int = 5, window: str = "training", top: int = 4, out: str = "",
                    seed_mode: str = "keyed") -> list[dict[str, Any]]:
    """Run the keyed schedule (`seed_mode` "keyed" or "keyed_context") for `steps` steps
    with pre-generation in `window` ("bubble" or "training"); print the `top` requests with
    the most forward passes per step, write every request's figures to `out` (JSON) when
    given, and return them."""
    from bubblespec.client import BubbleSpecClient
    from bubblespec.cluster import LocalCluster
    from bubblespec.tasks import default_model_dir, default_task
    from bubblespec.train.schedule import run_grpo

    task, model = default_task(), str(default_model_dir())
    results: list[Any] = []
    with LocalCluster(ranks=2, model=model,
                      rank_args=["--spec-mode=bubblespec"]) as cluster, \
            BubbleSpecClient(cluster.gateway_url) as client:
        client.wait_ready(timeout_s=300)
        # the bench's greedy check first, so service step numbers (and so the derived
        # keyed seeds) are the bench's
        client.rollout(task.make_prompts(4, 10_000), n=2, sampling_params={
            "temperature": 0.0, "max_new_tokens": task.max_new_tokens, "seed_mode": "keyed"},
            pregen=False)
        rollout = client.rollout

        def keep(*a: Any, **kw: Any) -> Any:
            res = rollout(*a, **kw)
            results.append(res)
            return res

        client.rollout = keep  # type: ignore[method-assign]
        sampling = {"temperature": 1.0, "max_new_tokens": task.max_new_tokens,
                    "seed_mode": seed_mode}
        run_grpo(client, task, model, steps, 8, 8, sampling, seed=0, lr=1e-4,
                 pregen=True, epoch_steps=3, pregen_window=window, log=print)
    rows = [{"step": k, "prompt_key": p.prompt_key, "sample_index": s.sample_index,
             "tokens": len(s.output_ids), "decode_steps": s.decode_steps,
             "accepted": s.num_accepted_tokens,
             "accepted_pregen": s.num_accepted_pregen_tokens or 0,
             "first_divergence": s.first_divergence, "draft_ran_out": s.draft_ran_out,
             "accepted_after_divergence": s.num_accepted_after_divergence or 0,
             "recouplings": s.num_recouplings or 0}
            for k, r in enumerate(results) for p in r.prompts for s in p.samples]
    for k in range(len(results)):
        mine = [r for r in rows if r["step"] == k]
        crit = max(r["decode_steps"] for r in mine)
        longest = max(r["tokens"] for r in mine)
        print(f"step {k}: critical path {crit} forwards, longest {longest} tokens, "
              f"crit/longest {crit / max(1, longest):.2f}, tokens/forward "
              f"{sum(r['tokens'] for r in mine) / max(1, sum(r['decode_steps'] for r in mine)):.2f}")
    print("\nstep  prompt            sample  tokens  fwd  accepted  accepted from pre-gen  "
          "first divergence  accepted after it  re-couplings  why it left")
    for k in range(len(results)):
        longest = sorted((r for r in rows if r["step"] == k), key=lambda r: -r["decode_steps"])
        for r in longest[:top]:
            print(f"{k:>4}  {r['prompt_key']:<16}  {r['sample_index']:>6}  {r['tokens']:>6}  "
                  f"{r['decode_steps']:>3}  {r['accepted']:>8}  {r['accepted_pregen']:>21}  "
                  f"{'-' if r['first_divergence'] is None else r['first_divergence']:>16}  "
                  f"{r['accepted_after_divergence']:>17}  {r['recouplings']:>12}  "
                  f"{_why(r['draft_ran_out'])}")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def _why(ran_out: bool | None) -> str:
    """Why a response left its pre-generated response: it ended there, or a token flipped."""
    return "-" if ran_out is None else ("draft ended" if ran_out else "flip")
