"""The GRPO schedule through the rollout service: rollout -> reward -> train -> push weights.

Step k rolls out a prompt batch through a gateway (passing the next step's prompts ahead so
idle ranks pre-generate them), scores the samples with the task's reward, takes one
`Trainer.step` (group-normalised advantages, PPO-clipped ratio against the rollout's
log-probs), saves the weights and pushes them with `update_weights`. Each step's figures are
those of `step_figures` plus the trainer's statistics.
`bubblespec train-demo` runs it once; `bubblespec bench service` runs it per rollout mode.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from bubblespec.protocol.keys import derive_seeds
from bubblespec.protocol.sampling import PregenWindow
from bubblespec.train.grpo import Rollout, Trainer
from bubblespec.train.pacing import step_pace
from bubblespec.train.positions import survival_by_position


def step_figures(result: Mapping[str, Any], report: Mapping[str, Any] | None,
                 wall_s: float, mean_reward: float) -> dict[str, Any]:
    """One step's figures from the rollout's JSON-like dict (`RolloutResponse` as a dict:
    counters, ranks, prompts) and the step timeline (`StepReport` as a dict, or None)."""
    c = result.get("counters", {})
    ranks = result.get("ranks", [])
    crit = int(c.get("decode_steps_critical", 0))
    crit_source = "rank_forward_passes"
    if crit <= 0:
        per_req = [s.get("decode_steps", 0) for p in result.get("prompts", [])
                   for s in p.get("samples", [])]
        crit = int(max(per_req, default=0))
        crit_source = "max_request_decode_steps"
    lengths = [len(s.get("output_ids", [])) for p in result.get("prompts", [])
               for s in p.get("samples", [])]
    rep_ranks = (report or {}).get("ranks", []) or []
    bubble = {r["rank_id"]: {k: r.get(k) for k in ("busy_s", "bubble_s", "pregen_s", "idle_s",
                                                    "bubble_fraction", "done_s",
                                                    "pregen_tokens")}
              for r in rep_ranks}
    n_draft = int(c.get("num_draft_tokens", 0))
    n_acc = int(c.get("num_accepted_tokens", 0))
    return {
        "wall_s": float(wall_s),
        "mean_reward": float(mean_reward),
        "decode_steps_critical": crit,
        "critical_source": crit_source,
        "decode_steps_total": int(c.get("decode_steps_total", 0)),
        "completion_tokens": int(c.get("completion_tokens", 0)),
        "tokens_per_forward": float(c.get("tokens_per_forward", 0.0)),
        "draft_tokens": n_draft,
        "accepted_tokens": n_acc,
        "acceptance": n_acc / n_draft if n_draft else None,
        "pregen_tokens": int((report or {}).get("pregen_tokens", 0) or 0),
        "window_pregen_tokens": int((report or {}).get("window_pregen_tokens", 0) or 0),
        "tail_pregen_tokens": int((report or {}).get("tail_pregen_tokens", 0) or 0),
        "accepted_pregen_tokens": int(c.get("num_accepted_pregen_tokens", 0)),
        "drafts_fetched_tokens": int(c.get("drafts_fetched_tokens", 0)),
        "rank_decode_steps": {r["rank_id"]: int(r.get("decode_steps", 0)) for r in ranks},
        "bubble": bubble,
        "bubble_fraction": (report or {}).get("bubble_fraction"),
        "max_len": max(lengths, default=0),
        "mean_len": sum(lengths) / len(lengths) if lengths else 0.0,
        "divergence": divergence_figures([s for p in result.get("prompts", [])
                                          for s in p.get("samples", [])]),
        "positions": survival_by_position([s for p in result.get("prompts", [])
                                           for s in p.get("samples", [])]),
    }


def request_figures(prompts: list[Any]) -> dict[str, Any]:
    """Per-request figures of a step, grouped by prompt like `output_lengths`: each
    response's forward passes, accepted pre-generated tokens, first divergence from its
    pre-generated response and draft tokens accepted at or after it (a margin branch or a
    re-coupling that caught the flip), and each prompt's rank (what a per-request calibration of the
    covered acceptance, and a model of where coupling breaks, read)."""
    return {
        "request_decode_steps": [[int(s.decode_steps) for s in pr.samples] for pr in prompts],
        "request_accepted_pregen": [[int(s.num_accepted_pregen_tokens or 0) for s in pr.samples]
                                    for pr in prompts],
        "request_first_divergence": [[s.first_divergence for s in pr.samples]
                                     for pr in prompts],
        "request_draft_ran_out": [[s.draft_ran_out for s in pr.samples] for pr in prompts],
        "request_accepted_after": [[int(s.num_accepted_after_divergence or 0)
                                    for s in pr.samples] for pr in prompts],
        "prompt_ranks": [pr.rank_id for pr in prompts],
    }


def divergence_figures(samples: list[Mapping[str, Any]]) -> dict[str, Any]:
    """How the step's responses followed their aligned pre-generated responses: accepted
    draft tokens before and at/after each one's first divergence, re-couplings, and the
    share of the tail (tokens from the first divergence on) that drafts still covered, over
    all responses that diverged and for the critical-path response (most forward passes).
    Samples are `RolloutSample` dicts; ranks that report no divergence fields count as
    never diverged."""
    after = [int(s.get("num_accepted_after_divergence") or 0) for s in samples]
    acc = [int(s.get("num_accepted_tokens") or 0) for s in samples]
    div = [s.get("first_divergence") for s in samples]
    tails = [len(s.get("output_ids", [])) - d if d is not None else 0
             for s, d in zip(samples, div)]
    tail_tokens = sum(tails)
    out: dict[str, Any] = {
        "responses": len(samples), "diverged": sum(d is not None for d in div),
        "ran_out": sum(bool(s.get("draft_ran_out")) for s in samples),
        "accepted_before": sum(max(0, a - b) for a, b in zip(acc, after)),
        "accepted_after": sum(after),
        "recouplings": sum(int(s.get("num_recouplings") or 0) for s in samples),
        "tail_tokens": tail_tokens,
        "tail_accepted_share": sum(after) / tail_tokens if tail_tokens else None,
        "critical": None}
    if samples:
        i = max(range(len(samples)), key=lambda j: int(samples[j].get("decode_steps") or 0))
        out["critical"] = {
            "tokens": len(samples[i].get("output_ids", [])),
            "decode_steps": int(samples[i].get("decode_steps") or 0),
            "first_divergence": div[i], "draft_ran_out": samples[i].get("draft_ran_out"),
            "accepted_before": max(0, acc[i] - after[i]),
            "accepted_after": after[i],
            "tail_accepted_share": after[i] / tails[i] if tails[i] else None}
    return out


def schedule_seeds(run_seed: int, step: int, num_prompts: int, n: int) -> list[list[int]]:
    """The seeds of schedule step `step`: a pure function of (run seed, schedule step, prompt
    position, sample index). The schedule passes them (and the next step's, for
    pre-generation) with every rollout, so that every mode of a benchmark samples with the
    same seeds whatever step number the gateway is at (the gateway's own derivation follows
    its step counter, which differs between modes sharing one cluster)."""
    return [derive_seeds(run_seed, step, f"p{j}", n) for j in range(num_prompts)]


def run_grpo(client: Any, task: Any, model_dir: str, steps: int, prompts_per_step: int, n: int,
             sampling: dict[str, Any], seed: int = 0, lr: float = 1e-4, pregen: bool = True,
             work_dir: str | None = None, log: Callable[[str], None] = print,
             train: bool = True, timeline_settle_s: float = 0.3,
             epoch_steps: int = 0, pregen_window: PregenWindow | None = None,
             min_train_s: float = 0.0, lookahead: int = 1,
             loss_agg: str = "seq-mean",
             pace_probe: Callable[[], Mapping[str, Any]] | None = None,
             on_step: Callable[[list[dict[str, Any]]], None] | None = None,
             checkpoint: bool = False, done: Sequence[dict[str, Any]] = (),
             weight_push: str = "disk"
             ) -> list[dict[str, Any]]:
    """Run the GRPO schedule: step k uses `task.make_prompts(prompts_per_step, seed + j)`
    with j = k, or k % epoch_steps when `epoch_steps` > 0 (the prompt set repeats every
    `epoch_steps` steps, as epochs over a dataset do; history drafts need that).
    `min_train_s`: the training window (train, save, push) lasts at least this long, as a
    larger model's would (paced benchmarks; pre-generation may use the window).
    Every rollout carries the schedule's own seeds (`schedule_seeds`). `lookahead`: how
    many future steps' batches each rollout hands ahead (1: the next step's only).
    `loss_agg`: the trainer's loss aggregation (`grpo.LOSS_AGGS`). `pace_probe`: reads the
    ranks' paced counters (`pacing.PaceProbe`) before and after each rollout, so that each
    step carries `pace` (`pacing.step_pace`: modelled rollout seconds, overruns; None when
    the ranks are not paced or a rank did not answer). `on_step`: called with the records
    so far after every step (`train-demo` writes its log there). `checkpoint`: save the
    trainer's state (`Trainer.save_state`) beside each step's weights in `work_dir`, which
    keeps the newest step's, so that a run can go on after it stopped. `done`: the records
    of the steps a stopped run completed (resume): the schedule loads the trainer from
    `work_dir/v<len(done)>`, pushes those weights to the ranks, and goes on from step
    len(done) with the same prompts and seeds, so under keyed sampling it samples the tokens
    the uninterrupted run would have (the first step after it has no pre-generated drafts:
    those were made in the stopped run's bubbles).
    Returns one dict per step (figures of `step_figures`, trainer stats, and `rewards`:
    each sample's reward, grouped by prompt like `output_lengths`)."""
    trainer = Trainer(model_dir, lr=lr, seed=seed, loss_agg=loss_agg) if train else None
    own_tmp = work_dir is None
    wdir = Path(tempfile.mkdtemp(prefix="bubblespec-grpo-") if own_tmp else work_dir)
    batches = [task.make_prompts(prompts_per_step, seed + (k % epoch_steps if epoch_steps else k))
               for k in range(steps + 1)]
    seeds = [schedule_seeds(seed, k, len(batches[k]), n) for k in range(steps + 1)]
    records: list[dict[str, Any]] = list(done)
    prev_dir: Path | None = None
    if records and trainer is not None:
        prev_dir = wdir / f"v{len(records)}"
        trainer.load_state(str(prev_dir))
        client.update_weights(str(prev_dir), version=len(records))
        for old in wdir.glob("v*"):  # what the stopped run had not removed yet
            if old != prev_dir and old.name[1:].isdigit():
                shutil.rmtree(old, ignore_errors=True)
    group: Any = None
    try:
        for k in range(len(records), steps):
            ahead = range(k + 1, min(steps, k + 1 + max(1, lookahead))) if pregen else ()
            nxt: Any = [batches[j] for j in ahead] or None
            nxt_seeds: Any = [seeds[j] for j in ahead] or None
            if nxt is not None and lookahead <= 1:  # the one-batch form
                nxt, nxt_seeds = nxt[0], nxt_seeds[0]
            pace0 = _read_pace(pace_probe, log, k)
            t0 = time.monotonic()
            res = client.rollout(batches[k], n=n, sampling_params=sampling, seeds=seeds[k],
                                 next_prompts=nxt, next_seeds=nxt_seeds,
                                 pregen=pregen, pregen_window=pregen_window)
            wall = time.monotonic() - t0
            pace1 = _read_pace(pace_probe, log, k) if pace0 is not None else None
            pace = step_pace(pace0, pace1, wall) if pace0 and pace1 else None
            groups = []
            for p, pr in zip(batches[k], res.prompts):
                outs = [s.output_ids for s in pr.samples]
                groups.append(Rollout(list(p.input_ids), outs,
                                      [list(s.output_logprobs or []) for s in pr.samples],
                                      [task.reward(p, o) for o in outs],
                                      [s.first_divergence if s.draft_ran_out is False else None
                                       for s in pr.samples]))
            rewards = [r for g in groups for r in g.rewards]
            mean_reward = sum(rewards) / max(1, len(rewards))
            t1 = time.monotonic()
            stats: dict[str, Any] = {}
            push_s = None
            if trainer is not None:
                stats = trainer.step(groups)
                vdir = wdir / f"v{k + 1}"
                if checkpoint or weight_push == "disk":
                    t_save = time.monotonic()
                    trainer.save(str(vdir))
                    if checkpoint:
                        trainer.save_state(str(vdir))
                    saved_s = time.monotonic() - t_save
                time.sleep(max(0.0, t1 + min_train_s - time.monotonic()))
                t_push = time.monotonic()
                if weight_push == "group":
                    if group is None:
                        group = _open_group(client, model_dir)
                    group.push(trainer.named_tensors(manifest_names(model_dir)), version=k + 1)
                    push_s = time.monotonic() - t_push
                else:  # the checkpoint write is the disk path's share of the push
                    client.update_weights(str(vdir), version=k + 1)
                    push_s = time.monotonic() - t_push + saved_s
            train_s = time.monotonic() - t1
            report = None
            try:
                time.sleep(timeline_settle_s)
                report = client.step_timeline(res.step).model_dump()
            except Exception as e:  # noqa: BLE001 (a missing timeline must not stop training)
                log(f"step {k}: no timeline ({e})")
            fig = step_figures(res.model_dump(), report, wall, mean_reward)
            fig.update(step=k, service_step=res.step, train_s=train_s, push_s=push_s,
                       weight_push=weight_push,
                       max_abs_logprob_gap=float(stats.get("max_abs_logprob_gap", 0.0)),
                       loss=float(stats.get("loss", 0.0)), trained_samples=stats.get("samples"),
                       entropy=stats.get("entropy"),
                       prompt_keys=[pr.prompt_key for pr in res.prompts],
                       output_lengths=[[len(s.output_ids) for s in pr.samples]
                                       for pr in res.prompts],
                       rewards=[list(g.rewards) for g in groups],
                       **request_figures(res.prompts),
                       output_ids_sha256=hashlib.sha256(json.dumps(
                           [[s.output_ids for s in pr.samples] for pr in res.prompts]
                       ).encode()).hexdigest(),
                       warnings=list(res.warnings), pace=pace)
            records.append(fig)
            log(format_row(fig))
            if on_step is not None:
                on_step(records)
            if trainer is not None:  # after the log: a stop in between resumes from here
                if prev_dir is not None:
                    shutil.rmtree(prev_dir, ignore_errors=True)
                prev_dir = wdir / f"v{k + 1}"
    finally:
        if group is not None:
            group.close()
        if own_tmp:
            shutil.rmtree(wdir, ignore_errors=True)
    return records


def manifest_names(model_dir: str) -> set[str]:
    """The tensor names of the model the ranks serve (what a push must carry)."""
    from bubblespec.engine.checkpoint import read_manifest

    return set(read_manifest(model_dir))


def _open_group(client: Any, model_dir: str) -> Any:
    """The trainer's weight group with the gateway's ranks (`client.weights`)."""
    from bubblespec.client.weights import WeightGroup

    group = WeightGroup(client.base_url, group_name="train", timeout_s=600)
    group.open()
    return group


def _read_pace(probe: Callable[[], Mapping[str, Any]] | None, log: Callable[[str], None],
               step: int) -> Mapping[str, Any] | None:
    """The ranks' paced counters, or None without a probe or when a rank did not answer (a
    rank restarting must not stop training; that step carries no paced figures)."""
    if probe is None:
        return None
    try:
        return probe()
    except (httpx.HTTPError, ValueError) as e:
        log(f"step {step}: no paced counters ({e})")
        return None


HEADER = (f"{'step':>4} {'reward':>7} {'wall s':>7} {'crit dec':>8} {'tok/fwd':>7} "
          f"{'pregen':>6} {'pg acc':>6} {'lp gap':>8} {'model s':>8} {'overrun':>7}")


def format_row(f: dict[str, Any]) -> str:
    """One step of `run_grpo` as a line under `HEADER` (modelled rollout seconds and
    overrunning forwards only with paced ranks, else '-')."""
    pace = f.get("pace")
    paced = (f"{pace['modelled_s']:>8.3f} {pace['overruns']:>7}" if pace
             else f"{'-':>8} {'-':>7}")
    return (f"{f['step']:>4} {f['mean_reward']:>7.3f} {f['wall_s']:>7.2f} "
            f"{f['decode_steps_critical']:>8} {f['tokens_per_forward']:>7.2f} "
            f"{f['pregen_tokens']:>6} {f['accepted_pregen_tokens']:>6} "
            f"{f['max_abs_logprob_gap']:>8.2e} {paced}")
