"""`bubblespec bench engine` (`make bench-engine`): decode steps of one batch per speculation mode.

Setup (tiny model, its task, temperature 1.0): batch B0 is sampled with the shipped
weights and one GRPO update turns them into new weights; meanwhile the OLD weights
pre-generate responses for the next batch B1 (what a rank does in its bubble). Then B1 is
rolled out with the NEW weights under each mode, same prompts and seeds:
(a) no speculation, (b) vLLM ngram, (c) vLLM suffix (needs `make bench-deps`),
(d) bubblespec with siblings only, (e) bubblespec with every live source and no pre-generated
drafts (prompt, own output, siblings, global pool: arctic's sources plus siblings),
(f) bubblespec with pre-generated drafts + siblings, (g) (f) plus every live source.
Keyed rows sample with keyed noise, so their tokens do not depend on the drafts: suffix_keyed
and bubblespec_live_keyed decode the very same tokens and compare drafters directly.
Per bubblespec row the proposer's per-source counters say which source won each step.
Decode steps = target forward passes that emitted tokens, summed over requests. Since
sampled lengths differ between modes, reductions are computed per generated token.
`--out PATH` writes B0's responses (token ids and log-probs, by prompt), the update's figures
and the rows as JSON, after B0 and again after every row (a run cut short keeps what it
did): the input of `bubblespec bench workload-stats`.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bubblespec.core.sources import DRAFTER_NAMES
from bubblespec.engine import EngineConfig, GenRequest
from bubblespec.engine.engine import RolloutEngine
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_model_dir, make_task
from bubblespec.train.grpo import Rollout, Trainer


@dataclass(frozen=True)
class EngineBenchConfig:
    """What `bubblespec bench engine` runs (its flags; defaults and help in its `--help`)."""

    prompts: int
    n: int
    seed: int
    lr: float
    model: str
    """HF model directory ("": the embedded model)."""
    task: str = "addchain"
    out: str = ""
    """JSON path for B0's responses and the rows ("": none)."""


def requests(prompts: list, n: int, seed: int, max_new: int, eos: int,
             seed_mode: str = "default") -> list[GenRequest]:
    return [GenRequest(input_ids=list(p.input_ids), n=n,
                       seeds=[seed * 100_003 + i * 1_009 + j for j in range(n)],
                       sampling=SamplingParams(max_new_tokens=max_new, temperature=1.0,
                                               stop_token_ids=[eos], seed_mode=seed_mode))
            for i, p in enumerate(prompts)]


def summarise(name: str, results: list, secs: float) -> dict:
    samples = [s for r in results for s in r.samples]
    steps = sum(s.decode_steps for s in samples)
    toks = sum(len(s.output_ids) for s in samples)
    acc = sum(s.num_accepted_tokens for s in samples)
    print(f"row {name}: {steps} decode steps, {toks} tokens, {acc} accepted, {secs:.1f} s",
          flush=True)  # as it comes: a long run cut short keeps its rows
    return {"mode": name, "requests": len(samples), "steps": steps, "tokens": toks,
            "steps_per_req": steps / len(samples), "tokens_per_req": toks / len(samples),
            "tokens_per_forward": toks / max(steps, 1), "accepted_per_forward": acc / max(steps, 1),
            "wall_s": secs}


def responses(results: list) -> list[list[dict]]:
    """Every sample's token ids and log-probs, grouped by prompt."""
    return [[{"ids": list(s.output_ids), "logprobs": [round(x, 5) for x in s.output_logprobs]}
             for s in r.samples] for r in results]


def save(path: str, doc: dict) -> None:
    """Write the `--out` document (nothing when `path` is "")."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc))


async def run_mode(name: str, cfg: EngineConfig, reqs: list[GenRequest]) -> dict:
    eng = await RolloutEngine.start(cfg)
    try:
        t = time.monotonic()
        res = await eng.generate(reqs)
        return summarise(name, res, time.monotonic() - t)
    finally:
        await eng.shutdown()


async def run(args: EngineBenchConfig) -> None:
    """B0 and the pre-generation of B1 with the old weights, one GRPO update, then B1
    under each mode with the new weights; prints the table and the reductions."""
    old_dir = args.model or str(default_model_dir())
    task = make_task(args.task, old_dir)
    b0 = task.make_prompts(args.prompts, seed=args.seed)
    b1 = task.make_prompts(args.prompts, seed=args.seed + 1)
    r0 = requests(b0, args.n, 0, task.max_new_tokens, task.eos_id)
    r1 = requests(b1, args.n, 1, task.max_new_tokens, task.eos_id)
    k1 = requests(b1, args.n, 1, task.max_new_tokens, task.eos_id, seed_mode="keyed")
    new_dir = tempfile.mkdtemp(prefix="bubblespec-newweights-")
    rows: list[dict] = []
    doc = {"config": asdict(args), "model": old_dir, "rows": rows}
    # Old weights: sample B0 (the step that trains) and pre-generate B1 in "the bubble".
    # no global pool: it would hold the B1 pre-generation and blur the modes apart
    eng = await RolloutEngine.start(EngineConfig(model=old_dir, spec_mode="bubblespec",
                                                 sources="pregen,siblings,self"))
    try:
        out0 = await eng.generate(r0)
        pregen = await eng.generate(r1)
        pregen_keyed = await eng.generate(k1)
        trainer = Trainer(old_dir, lr=args.lr, threads=2)
        stats = trainer.step([Rollout(list(p.input_ids), [s.output_ids for s in o.samples],
                                      [s.output_logprobs for s in o.samples],
                                      [task.reward(p, s.output_ids) for s in o.samples])
                              for p, o in zip(b0, out0)], micro_batch=8)
        trainer.save(new_dir)  # micro-batches of 8: the real model's logits are 49k wide
        doc["b0"] = {"responses": responses(out0), **{k: float(stats[k]) for k in
                     ("mean_reward", "loss", "max_abs_logprob_gap")}}
        save(args.out, doc)
        print(f"GRPO update on B0: mean reward {stats['mean_reward']:.3f}, loss "
              f"{stats['loss']:.4f}, max |logprob gap| {stats['max_abs_logprob_gap']:.2e}")
        await eng.update_weights(new_dir)
        pushed = [(r.group_key(), s.sample_index, s.output_ids)
                  for r, o in zip(r1, pregen) for s in o.samples]
        pushed_keyed = [(r.group_key(), s.sample_index, s.output_ids)
                        for r, o in zip(k1, pregen_keyed) for s in o.samples]
        # (row, requests, pre-generated drafts, siblings-only?, global pool?, live in it?)
        for name, reqs, drafts, sib_only, glob, glive in (
                ("bubblespec_siblings", r1, None, True, False, False),
                ("bubblespec_live", r1, None, False, True, False),
                ("bubblespec_live_glive", r1, None, False, True, True),
                ("bubblespec_pregen", r1, pushed, True, False, False),
                ("bubblespec_all", r1, pushed, False, True, False),
                ("bubblespec_pregen_keyed", k1, pushed_keyed, True, False, False),
                ("bubblespec_live_keyed", k1, None, False, True, False),
                ("bubblespec_live_keyed_glive", k1, None, False, True, True)):
            on = {"pregen": drafts is not None, "siblings": True, "self": not sib_only,
                  "global": glob, "global_live": glive}
            await eng.set_sources([s for s, yes in on.items() if yes])
            if drafts:
                await eng.add_drafts(drafts)
            t = time.monotonic()
            rows.append(summarise(name, await eng.generate(reqs), time.monotonic() - t))
            rows[-1]["sources"] = await eng.source_stats(reset=True)
            print(f"row {name} sources: {rows[-1]['sources']}", flush=True)
            save(args.out, doc)
            await eng.release_groups([r.group_key() for r in reqs])
    finally:
        await eng.shutdown()
    rows.insert(0, await run_mode("nospec", EngineConfig(model=new_dir, spec_mode="none"), r1))
    save(args.out, doc)
    rows.insert(1, await run_mode("ngram", EngineConfig(model=new_dir, spec_mode="ngram"), r1))
    save(args.out, doc)
    if importlib.util.find_spec("arctic_inference"):
        rows.insert(2, await run_mode("suffix", EngineConfig(model=new_dir, spec_mode="suffix"),
                                      r1))
        rows.append(await run_mode("suffix_keyed",
                                   EngineConfig(model=new_dir, spec_mode="suffix"), k1))
        save(args.out, doc)
    else:
        print("vLLM suffix: arctic-inference not installed (run `make bench-deps`)")
    base = rows[0]["steps"] / max(rows[0]["tokens"], 1)
    print(f"\n{args.task}: {args.prompts} prompts x n={args.n}, T=1.0, "
          f"k={EngineConfig().num_speculative_tokens}")
    hdr = ("mode", "steps/req", "tokens/req", "tokens/fwd", "accepted/fwd", "wall_s")
    print("{:<30}{:>10}{:>12}{:>12}{:>14}{:>9}".format(*hdr))
    red = {}
    for r in rows:
        print(f"{r['mode']:<30}{r['steps_per_req']:>10.1f}{r['tokens_per_req']:>12.1f}"
              f"{r['tokens_per_forward']:>12.2f}{r['accepted_per_forward']:>14.2f}"
              f"{r['wall_s']:>9.1f}")
        red[r["mode"]] = 1 - (r["steps"] / max(r["tokens"], 1)) / base
    print("\ndraft sources per bubblespec row: steps won / drafted tokens / accepted tokens")
    for r in rows:
        if r.get("sources"):
            src = r["sources"]
            print(f"{r['mode']:<30}" + "  ".join(
                f"{s}={src[s + '_wins']}/{src[s + '_drafted']}/{src[s + '_accepted']}"
                for s in DRAFTER_NAMES) + f"  none={src['empty']}")
    if "suffix_keyed" in red:  # keyed sampling: both rows decode the very same tokens
        print(f"same tokens (keyed): suffix_keyed={red['suffix_keyed']:.3f} "
              f"bubblespec_live_keyed={red['bubblespec_live_keyed']:.3f} "
              f"bubblespec_live_keyed_glive={red['bubblespec_live_keyed_glive']:.3f} "
              "(glive: live responses in the global pool, the global_live source)")
    fmt = {k: (f"{red[k]:.3f}" if k in red else "n/a") for k in
           ("ngram", "suffix", "bubblespec_siblings", "bubblespec_pregen")}
    print(f"bubblespec_pregen_keyed (pre-generated drafts + keyed-noise sampling): "
          f"{red.get('bubblespec_pregen_keyed', float('nan')):.3f}")
    print("decode_step_reduction_vs_nospec: ngram={ngram} suffix={suffix} "
          "bubblespec_siblings={bubblespec_siblings} bubblespec_pregen={bubblespec_pregen}"
          .format(**fmt) + f" bubblespec_live={red.get('bubblespec_live', float('nan')):.3f}"
          f" bubblespec_live_glive={red.get('bubblespec_live_glive', float('nan')):.3f}"
          f" bubblespec_all={red.get('bubblespec_all', float('nan')):.3f}")
    if args.out:
        print(f"wrote {args.out}")
