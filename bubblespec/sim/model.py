"""Discrete-event model of synchronous RL rollout over R ranks, with and without bubblespec.

Everything this module produces is MODELLED (see engine_time, policy and workload for where
each figure comes from). One scenario = one rank count R; it draws `steps` consecutive
rollout steps (common random numbers: every mode sees the same lengths), and for each mode:

1. step s: every rank decodes its shard (rollout.build_timeline); the step's rollout ends when
   the slowest rank finishes (F_max); the bubble of rank r is F_max - F_r;
2. in a pre-generating mode, idle ranks pre-generate step s+1 in the bubble, and with the
   TRAINING window also while the trainer trains for `train_s` after F_max
   (pregen.simulate_pregen); the covered prefixes feed step s+1's acceptance, and the step
   is charged F_max plus whatever part of the pre-gen stop lag the trainer's `train_s` does
   not hide (with the default `train_s` = 0 the whole lag counts: conservative);
3. step 0 has no pre-generated drafts (nothing ran before it); the summary averages steps
   >= warmup_steps (default 1, as the bench reports "all steps after step 0");
4. with `lookahead` D > 1 (prompts handed D steps ahead) the bubble's queue holds the
   tasks of steps s+1 .. s+D, nearest step first: a bubble that covered s+1 goes on to
   s+2. A draft of a later step lasts until that step; when a later bubble reaches its task
   again it is *refreshed*: the lane verifies the old draft's leading tokens that the
   newer weights still agree with (up to an independently drawn flip) at the covered rate,
   then generates on; a refresh stopped before it passed them leaves the old draft. A
   draft used two or more updates after it was made leaves its response at the earlier of
   two independent flips (ages past two are modelled as two);
5. with a tail-fill budget (`ModeSpec.tail_fill`) ranks also pre-generate beside their own
   requests from the start of their shard, which finishes later by what the lanes add to
   its forwards (`sim.tail_fill`).

Every mode's forwards are charged as the paced engines charge them (`mode_time`): the
baseline (no drafts) runs with vLLM's async scheduling, its engine host overhead hidden
under the forward (`SimConfig.async_baseline`); a speculative mode pays the product's host
work per forward in series (`ModeSpec.host_s`, measured per mode by a paced run's
counters, else `SimConfig.spec_host_s`).

A mode's speed-up is its throughput (tokens per second of step time) over the baseline's;
with common lengths that is the ratio of step times. `run_mode` also replays given steps
(`bubblespec.calibration.replay`: a paced run's own lengths, assignment and per-step
acceptance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.policy import ModeSpec
from bubblespec.sim.pregen import breadth_first, simulate_pregen
from bubblespec.sim.pregen_order import ORDERS, predicted_order
from bubblespec.sim.rollout import Requests, build_timeline
from bubblespec.sim.tail_fill import tail_fill
from bubblespec.sim.workload import LengthSource, assign_prompts

SPEC_HOST_S = 1.0e-3
"""Default `SimConfig.spec_host_s`: measured in the paced runs that charge every cost
(docs/data/paced_r{16,128x4}_ahead3_charged*.json: drafting plus the product's host work
per forward of keyed three-ahead, 0.81-0.99 ms at 16 rows per rank and 1.26-1.30 ms at 128,
on this project's 2-core machine standing for a GPU host's CPU)."""
NO_FLIP = np.iinfo(np.int64).max // 4
"""The flip position of a response that never leaves its draft (`_requests`' `flip`)."""


@dataclass(frozen=True)
class ControlPlane:
    """What one synchronizer daemon costs a step, from `bubblespec bench control-plane`
    (its JSON's `config` and `summary`): the daemon serves `calls_per_rank_s` calls per
    rank per second at `cpu_per_call_s` of CPU each on `cores`; above one core's worth of
    load (`load`), every call queues in proportion. At each step's start every rank fetches
    its prompts' drafts, on the critical path: through the daemon at `fetch_tokens_per_s`
    (the measured burst rate), or, with drafts served by the ranks that pushed them
    (`peer_tokens_per_s` set: a record of `--drafts-from peers`), the daemon's
    `locate_s_per_draft` per draft plus each rank's share of the tokens at the rate one
    serving process gave in the bench, all ranks serving at once. The stop reaches a
    pre-generating rank `stop_latency_s` after the last rank is done."""

    calls_per_rank_s: float
    cpu_per_call_s: float
    fetch_tokens_per_s: float
    stop_latency_s: float
    cores: float = 1.0
    calls_per_rank_step: float | None = None
    """A record of a rank's push pattern (`--lane-tokens-per-s`): its calls per rank per
    step other than heartbeats, so that the load follows the modelled step's length (the
    bench's steps last seconds); None (the stress pattern): `calls_per_rank_s` as measured."""
    heartbeats_per_rank_s: float = 0.0
    peer_tokens_per_s: float | None = None
    """Draft tokens per second one rank serves to the others (None: the daemon serves)."""
    locate_s_per_draft: float = 0.0
    """The daemon's seconds per draft it locates instead of sending (peers only)."""

    @classmethod
    def from_bench(cls, doc: dict) -> ControlPlane:
        """From the figures `bubblespec bench control-plane --out` writes."""
        cfg, s = doc["config"], doc["summary"]
        fetched = cfg["ranks"] * cfg["prompts_per_rank"] * cfg["samples"] * cfg["draft_tokens"]
        burst = max(s["fetch_burst_s"], 1e-9)
        peers = cfg.get("drafts_from") == "peers"
        return cls(calls_per_rank_s=s["calls_per_s"] / cfg["ranks"],
                   cpu_per_call_s=s["daemon_cpu_per_wall"] / max(s["calls_per_s"], 1e-9),
                   fetch_tokens_per_s=fetched / burst,
                   stop_latency_s=s["stop_latency_p99_s"],
                   calls_per_rank_step=(s.get("calls_per_rank_step")
                                        if cfg.get("lane_tokens_per_s", 0) > 0 else None),
                   heartbeats_per_rank_s=s.get("heartbeats_per_rank_s", 0.0),
                   peer_tokens_per_s=fetched / cfg["procs"] / burst if peers else None,
                   locate_s_per_draft=s.get("locate_s_per_draft", 0.0) if peers else 0.0)

    def load(self, ranks: int, step_s: float | None = None) -> float:
        """Daemon cores the ranks' calls need, per core it has (above 1: it queues), in a
        step of `step_s` seconds where the record says how calls follow the step."""
        per_rank = self.calls_per_rank_s
        if self.calls_per_rank_step is not None and step_s:
            per_rank = self.calls_per_rank_step / step_s + self.heartbeats_per_rank_s
        return ranks * per_rank * self.cpu_per_call_s / self.cores

    def fetch_s(self, tokens: float, ranks: int, drafts: int = 0,
                step_s: float | None = None) -> float:
        """The fetch burst of `tokens` draft tokens in `drafts` drafts to `ranks` ranks."""
        queued = max(1.0, self.load(ranks, step_s))
        if self.peer_tokens_per_s is None:
            return tokens / self.fetch_tokens_per_s * queued
        return (drafts * self.locate_s_per_draft * queued
                + tokens / max(ranks, 1) / self.peer_tokens_per_s)

    def stop_s(self, ranks: int, step_s: float | None = None) -> float:
        """From the last rank's report to a pre-generating rank seeing the stop."""
        return self.stop_latency_s * max(1.0, self.load(ranks, step_s))


@dataclass
class SimConfig:
    """Workload and scheduling parameters (defaults and their sources in `--help`)."""

    prompts_per_rank: int = 8
    """Prompts per rank when `prompts` is None (weak scaling: the batch grows with R)."""
    prompts: int | None = None
    """Fixed prompts per step across all R (strong scaling), or None."""
    n: int = 16
    """Samples per prompt (GRPO group size)."""
    max_num_seqs: int = 256
    """Concurrent sequences per rank (vLLM max_num_seqs)."""
    assign: str = "round_robin"
    """Prompt-to-rank assignment: round_robin or lpt."""
    lpt_noise: float = 0.5
    """Log-sd of the LPT work estimate's error (0 = oracle)."""
    prompt_len: int = 256
    """Prompt tokens per request (initial KV context; prefill once per prompt)."""
    steps: int = 4
    """Rollout steps simulated per mode."""
    warmup_steps: int = 1
    """Leading steps left out of the summary (step 0 has no pre-generated drafts)."""
    pregen_inflight: int = 64
    """Tasks a rank keeps decoding at once while pre-generating (refilled from the queue as
    lanes finish; `bubblespec/rank/config.py` pregen_inflight)."""
    pregen_accepted: float | None = None
    """Draft tokens accepted per forward while pre-generating; None: the mode's uncovered
    figure (the rank runs pre-generation lanes through its engine and proposer, which
    drafts for them from their siblings among the lanes and their own output, as at
    positions no pre-generated draft covers)."""
    pregen_drafted: float | None = None
    """Draft tokens verified per forward while pre-generating; None: the mode's uncovered
    figure."""
    pregen_order: str = "breadth_first"
    """Task queue order: breadth_first (the synchronizer's) or longest_first (estimated
    length, with the `lpt_noise` error; beyond the design, to size the value of length
    prediction)."""
    rpc_s: float = 0.5e-3
    """Latency of one synchronizer RPC (claim, push, poll answer)."""
    train_s: float = 0.0
    """Seconds between a step's rollout end and the next step (trainer, weight push): the
    TRAINING window of modes that pre-generate in it, and the time that hides pre-gen stop
    lag (0: none, every lag counts)."""
    accept_cv: float = 0.0
    """Coefficient of variation of per-request acceptance (gamma); 0 = every request at the
    mode's mean."""
    cover_cv: float = 0.0
    """Coefficient of variation of per-request acceptance at covered positions only (gamma,
    mean 1): an aligned draft holds for some requests and is left early by others; 0 =
    every request at the mode's covered mean."""
    flip_share: float = 0.0
    """Share of the responses with a pre-generated draft that leave it (a policy update
    flips a keyed token; measured by `bench flips` or the paced records); 0: none."""
    flip_positions: tuple[float, ...] = ()
    """Where they leave it, as shares of the response's length (drawn from these)."""
    caught_share: float = 0.0
    """Share of those flips that a margin branch catches (measured): the response goes on
    following the branch's draft, so its tail decodes at the mode's caught-tail rates
    (`ModeSpec.after_caught_by_tail`) instead of the after-flip ones."""
    lookahead: int = 1
    """Future steps whose prompts each step hands ahead (1: the next step's only)."""
    spec_tokens: int = 8
    """Draft tokens an engine step may verify per sequence (vLLM's num_speculative_tokens;
    the rank's default): tail-fill counts a lane at 1 + this."""
    rate_spread: bool = False
    """Draw each request's tokens per forward from its mode's measured per-request spread
    (`ModeSpec.rate_spread`; one uniform quantile per request, shared by the modes so that
    they are compared on the same luck)."""
    seed: int = 0
    control_plane: ControlPlane | None = None
    """Charge the synchronizer's cost (`ControlPlane`): None, free (the projections before
    issue 60)."""
    async_baseline: bool = True
    """The baseline (no drafts) runs with vLLM's async scheduling, its default on a GPU
    without speculation: the engine's host overhead (`EngineTime.t_host`) hides under the
    forward (`EngineTime.charged`), as in the paced engines. False: paid in series (the
    projections before issue 56)."""
    spec_async: bool = False
    """What-if: speculative modes run with async scheduling too (drafting that needs no host
    sync, so vLLM could overlap their host work with the forward as it does the
    baseline's). Not what the product does today: `simulate --spec-async`."""
    spec_host_s: float = SPEC_HOST_S
    """Host seconds the product adds to each forward of a speculative mode (drafting, the
    keyed host path, its calls into the engine), paid in series: vLLM runs the `custom_class`
    and `suffix` drafters without async scheduling."""


@dataclass
class StepResult:
    """One (R, mode, step), modelled."""

    step: int
    step_time_s: float
    rollout_time_s: float
    tokens: int
    cp_forwards: int
    total_forwards: int
    bubble_s: float
    """Rank-seconds idle (or pre-generating) before F_max, summed over ranks."""
    pregen_busy_s: float
    coverage: float
    """Token share of this step covered by drafts pre-generated in the previous step."""
    pregen_tokens: int
    stop_lag_s: float
    rank_forwards: list[int] = field(default_factory=list)
    """Forwards (decode steps) of each rank in the step."""
    control_plane_s: float = 0.0
    """Of `step_time_s`, the synchronizer's (`SimConfig.control_plane`)."""


@dataclass
class Summary:
    """One (R, mode) over the summarised steps, modelled."""

    ranks: int
    mode: str
    step_time_s: float
    throughput_tok_s: float
    cp_decode_steps: float
    total_decode_steps: float
    bubble_fraction: float
    pregen_bubble_share: float
    coverage: float
    stop_lag_s: float
    control_plane_s: float = 0.0
    """Mean seconds per step the synchronizer cost (fetch burst, stop past the train window)."""
    speedup: float = 1.0
    cp_reduction: float = 0.0
    steps: list[StepResult] = field(default_factory=list)

    def row(self) -> dict:
        d = asdict(self)
        d.pop("steps")
        return d


def draw_steps(cfg: SimConfig, ranks: int, lengths: LengthSource) -> dict[str, np.ndarray]:
    """Lengths, rank assignment and acceptance multipliers for every step of a scenario."""
    rng = np.random.default_rng([cfg.seed, ranks])
    prompts = cfg.prompts if cfg.prompts is not None else cfg.prompts_per_rank * ranks
    if prompts < 1 or cfg.n < 1:
        raise ValueError("need at least one prompt and one sample")
    L = np.stack([lengths.sample(rng, prompts, cfg.n) for _ in range(cfg.steps)])
    assign = np.stack([assign_prompts(L[s], ranks, cfg.assign, cfg.lpt_noise, rng)
                       for s in range(cfg.steps)])
    mult = gamma_mult(rng, cfg.accept_cv, L.shape)
    if cfg.pregen_order == "breadth_first":
        order = np.stack([breadth_first(prompts, cfg.n)] * cfg.steps)
    elif cfg.pregen_order == "longest_first":
        est = L.reshape(cfg.steps, -1) * np.exp(cfg.lpt_noise * rng.standard_normal(
            (cfg.steps, prompts * cfg.n)))
        order = np.argsort(-est, axis=1, kind="stable")
    elif cfg.pregen_order in ORDERS:
        order = np.stack([predicted_order(L[s], rng, cfg.lpt_noise,
                                          cfg.pregen_order == "predicted_deep")
                          for s in range(cfg.steps)])
    else:
        raise ValueError(f"unknown pregen order {cfg.pregen_order!r}")
    drawn = {"lengths": L, "assign": assign, "mult": mult, "pregen_order": order,
             "mult_cov": gamma_mult(rng, cfg.cover_cv, L.shape)}
    if cfg.flip_share > 0 and cfg.flip_positions:
        hit = rng.random(L.shape) < cfg.flip_share
        at = np.floor(rng.choice(np.asarray(cfg.flip_positions), L.shape) * L)
        drawn["flip"] = np.where(hit, at, NO_FLIP).astype(np.int64).reshape(cfg.steps, -1)
    if cfg.rate_spread:
        drawn["rate_q"] = rng.random((cfg.steps, prompts * cfg.n))
    if "flip" in drawn and cfg.lookahead > 1:  # drawn last: D = 1 draws what it always did
        for key in ("flip_aged", "flip_refresh"):
            hit = rng.random(L.shape) < cfg.flip_share
            at = np.floor(rng.choice(np.asarray(cfg.flip_positions), L.shape) * L)
            drawn[key] = np.where(hit, at, NO_FLIP).astype(np.int64).reshape(cfg.steps, -1)
    if "flip" in drawn and cfg.caught_share > 0:  # drawn last, as above
        drawn["caught"] = (rng.random(L.shape) < cfg.caught_share).reshape(cfg.steps, -1)
    return drawn


def gamma_mult(rng: np.random.Generator, cv: float, shape: tuple[int, ...]) -> np.ndarray:
    """Per-request acceptance multipliers: gamma with mean 1 and coefficient of variation
    `cv` (ones for cv = 0, drawing nothing)."""
    if cv <= 0:
        return np.ones(shape)
    k = 1.0 / cv ** 2
    return rng.gamma(k, 1.0 / k, size=shape)


def _scaled(accepted: np.ndarray, mult: np.ndarray) -> np.ndarray:
    """Accepted per forward with the tokens per forward (1 + accepted) times `mult`, never
    below one token per forward (no speculation)."""
    return np.maximum(0.0, (1.0 + accepted) * mult - 1.0)


def _requests(cfg: SimConfig, L: np.ndarray, assign: np.ndarray, mult: np.ndarray,
              mult_cov: np.ndarray, covered: np.ndarray, mode: ModeSpec,
              et: EngineTime, flip: np.ndarray | None = None,
              flip_mult: np.ndarray | None = None, rate_q: np.ndarray | None = None,
              caught: np.ndarray | None = None) -> Requests:
    """The step's requests; `flip` (per request, optional): the output position where the
    response leaves its pre-generated draft (a policy update flipped a token there), past
    which its draft no longer covers it and it decodes at the mode's accepted-after-flip
    rate for its tail's length (default: the uncovered rate), its tokens per forward times
    `flip_mult` (per request, optional; in a mode without pre-generation, every position's).
    `rate_q` (per request, optional): quantiles of
    the mode's measured per-request spread (`ModeSpec.spread_at`), applied to the tails
    after a flip of a pre-generating mode and to every position of the others. `caught`
    (per request, optional): the flips a margin branch caught, whose tails decode at the
    mode's caught-tail rates."""
    prompts, n = L.shape
    size = prompts * n
    first = np.zeros((prompts, n))
    first[:, 0] = cfg.prompt_len * et.t_flop
    m = mult.ravel()
    cov = np.minimum(covered, L.ravel()) if mode.uses_pregen else np.zeros(size, np.int64)
    acc_unc = mode.accepted * m
    if flip_mult is None and rate_q is not None:
        flip_mult = mode.spread_at(rate_q.ravel())
    if flip_mult is not None and not mode.uses_pregen:
        acc_unc = _scaled(acc_unc, flip_mult.ravel())
    if flip is not None and mode.uses_pregen:
        flipped = flip.ravel() < cov
        cov = np.minimum(cov, flip.ravel())
        after = mode.after_flip(np.maximum(0, L.ravel() - flip.ravel()),
                                None if caught is None else caught.ravel())
        if after is not None and flip_mult is not None:
            after = _scaled(after, flip_mult.ravel())
        if after is not None:
            acc_unc = np.where(flipped, after * m, acc_unc)
    return Requests(rank=np.repeat(assign, n), length=L.ravel(), covered=cov,
                    acc_cov=mode.covered_rate(cov) * m * mult_cov.ravel(),
                    acc_unc=acc_unc,
                    drafted_cov=np.full(size, mode.drafted_covered),
                    drafted_unc=np.full(size, mode.drafted),
                    prefill=first.ravel(), prompt_len=float(cfg.prompt_len))


def run_mode(cfg: SimConfig, ranks: int, mode: ModeSpec | Sequence[ModeSpec], et: EngineTime,
             drawn: dict[str, np.ndarray]) -> list[StepResult]:
    """All steps of one mode at one R (`mode`: one spec, or one per step)."""
    L, A, M = drawn["lengths"], drawn["assign"], drawn["mult"]
    specs = [mode] * cfg.steps if isinstance(mode, ModeSpec) else list(mode)
    if len(specs) != cfg.steps:
        raise ValueError(f"{len(specs)} mode specs for {cfg.steps} steps")
    size = L[0].size
    drafts = Drafts(size)
    out = []
    base_et = et
    for s in range(cfg.steps):
        mode = specs[s]
        et = mode_time(cfg, mode, base_et)
        covered, made = drafts.take(s)
        flip, fm, q = drawn.get("flip"), drawn.get("flip_mult"), drawn.get("rate_q")
        hit = drawn.get("caught")
        flip_s = None if flip is None else flip[s]
        if flip_s is not None and "flip_aged" in drawn:  # older drafts flip earlier
            flip_s = np.where((made >= 0) & (s - made >= 2),
                              np.minimum(flip_s, drawn["flip_aged"][s]), flip_s)
        req = _requests(cfg, L[s], A[s], M[s], drawn["mult_cov"][s], covered, mode, et,
                        flip_s, None if fm is None else fm[s],
                        None if q is None else q[s], None if hit is None else hit[s])
        tl = build_timeline(req, ranks, cfg.max_num_seqs, et)
        F = tl.finish_t
        tail = None
        if mode.uses_pregen and mode.tail_fill > 0 and s + 1 < cfg.steps:
            tail = tail_fill(tl, et, mode.tail_fill, cfg.spec_tokens,
                             cfg.prompt_len + float(L[s + 1].max()), cfg.pregen_inflight,
                             _or(cfg.pregen_drafted, mode.drafted))
            F = F * (1.0 + tail.slowdown)
        fmax = float(F.max())
        slow = int(np.argmax(F))
        tokens = int(L[s].sum())
        cov_share = float(req.covered.sum()) / max(tokens, 1)
        busy, lag, ptok = 0.0, 0.0, 0
        cp = cfg.control_plane
        # the synchronizer's charge: the fetch burst at the step's start, and the stop's
        # lateness where it runs past the train window
        burst = (cp.fetch_s(float(covered.sum()), ranks, int(np.count_nonzero(covered)),
                            fmax) if cp and mode.uses_pregen else 0.0)
        charged = burst
        step_time = fmax
        window = cfg.train_s if mode.pregen_window else 0.0
        if mode.uses_pregen and s + 1 < cfg.steps:
            future = list(range(s + 1, min(cfg.steps, s + 1 + max(1, cfg.lookahead))))
            old = np.concatenate([drafts.covered(t) for t in future])
            head = old
            if "flip_refresh" in drawn:  # the newer weights agree with the old draft so far
                head = np.minimum(old, np.concatenate([drawn["flip_refresh"][t]
                                                       for t in future]))
            order = np.concatenate([drawn["pregen_order"][t] + j * size
                                    for j, t in enumerate(future)])
            pg = simulate_pregen(F, np.concatenate([L[t] for t in future]), et,
                                 cfg.pregen_inflight, cfg.rpc_s, cfg.prompt_len,
                                 _or(cfg.pregen_accepted, mode.accepted),
                                 _or(cfg.pregen_drafted, mode.drafted), order, window,
                                 head, mode.accepted_covered, tail)
            for j, t in enumerate(future):
                part = slice(j * size, (j + 1) * size)
                drafts.update(t, s, pg.covered[part], head[part], L[t].ravel())
            busy = float(pg.busy_in_bubble.sum())
            over = max(0.0, float(pg.stop_t.max()) - fmax)  # until the last rank is free
            if cp is not None:  # the stop reaches the ranks later: part may pass the window
                stop = cp.stop_s(ranks, fmax)
                charged += max(0.0, over + stop - cfg.train_s) - max(0.0, over - cfg.train_s)
                over += stop
            step_time = fmax + max(0.0, over - cfg.train_s)
            lag = max(0.0, over - window)  # past the stop signal
            ptok = pg.pregen_tokens
        out.append(StepResult(s, step_time + burst, fmax, tokens, int(tl.finish_k[slow]),
                              int(tl.finish_k.sum()), float((fmax - F).sum()), busy, cov_share,
                              ptok, lag, [int(k) for k in tl.finish_k], charged))
    return out


def mode_time(cfg: SimConfig, mode: ModeSpec, et: EngineTime) -> EngineTime:
    """The forward-time model a mode's ranks run at: the baseline with async scheduling
    (`SimConfig.async_baseline`), a speculative mode with the product's host work per
    forward (`ModeSpec.host_s`, else `SimConfig.spec_host_s`) paid in series, or overlapped
    in the `SimConfig.spec_async` what-if."""
    if mode.is_baseline:
        return et.charged(async_host=cfg.async_baseline)
    return et.charged(async_host=cfg.spec_async,
                      extra_host_s=cfg.spec_host_s if mode.host_s is None else mode.host_s)


class Drafts:
    """The pre-generated drafts of future steps: per step, each request's covered leading
    tokens and the step whose bubble made its draft (-1: none)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._cov: dict[int, np.ndarray] = {}
        self._made: dict[int, np.ndarray] = {}

    def covered(self, step: int) -> np.ndarray:
        return self._cov.get(step, np.zeros(self.size, dtype=np.int64))

    def made(self, step: int) -> np.ndarray:
        return self._made.get(step, np.full(self.size, -1, dtype=np.int64))

    def take(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The drafts of `step` (its rollout starts), forgotten here."""
        out = self.covered(step), self.made(step)
        self._cov.pop(step, None)
        self._made.pop(step, None)
        return out

    def update(self, step: int, bubble: int, reached: np.ndarray, head: np.ndarray,
               length: np.ndarray) -> None:
        """After `bubble`'s pre-generation: a task that got past its valid head, or finished
        its response, has a new draft of `reached` tokens; the others keep what they had."""
        new = (reached > head) | (reached >= length)
        self._cov[step] = np.where(new, reached, self.covered(step)).astype(np.int64)
        self._made[step] = np.where(new, bubble, self.made(step)).astype(np.int64)


def _or(x: float | None, default: float) -> float:
    return default if x is None else x


def summarise(ranks: int, mode: str, steps: list[StepResult], warmup: int) -> Summary:
    use = steps[warmup:] if len(steps) > warmup else steps[-1:]
    t = sum(x.step_time_s for x in use)
    roll = sum(x.rollout_time_s for x in use)
    bub = sum(x.bubble_s for x in use)
    tok = sum(x.tokens for x in use)
    return Summary(
        ranks=ranks, mode=mode, step_time_s=t / len(use), throughput_tok_s=tok / max(t, 1e-12),
        cp_decode_steps=sum(x.cp_forwards for x in use) / len(use),
        total_decode_steps=sum(x.total_forwards for x in use) / len(use),
        bubble_fraction=bub / max(ranks * roll, 1e-12),
        pregen_bubble_share=sum(x.pregen_busy_s for x in use) / bub if bub > 0 else 0.0,
        coverage=sum(x.coverage * x.tokens for x in use) / max(tok, 1),
        stop_lag_s=max(x.stop_lag_s for x in use),
        control_plane_s=sum(x.control_plane_s for x in use) / len(use), steps=steps)


def run_scenario(cfg: SimConfig, ranks: int, modes: list[ModeSpec], et: EngineTime,
                 lengths: LengthSource) -> list[Summary]:
    """Every mode at one R; speedups against the first baseline mode (else the first mode)."""
    if ranks < 1:
        raise ValueError("ranks must be >= 1")
    drawn = draw_steps(cfg, ranks, lengths)
    out = [summarise(ranks, m.name, run_mode(cfg, ranks, m, et, drawn), cfg.warmup_steps)
           for m in modes]
    base = next((s for s, m in zip(out, modes) if m.is_baseline), out[0])
    for s in out:
        relate(s, base)
    return out


def relate(s: Summary, base: Summary) -> None:
    """Set `s`'s speed-up (throughput ratio) and critical-path cut against `base`."""
    s.speedup = s.throughput_tok_s / base.throughput_tok_s if base.throughput_tok_s > 0 else 1.0
    s.cp_reduction = (1.0 - s.cp_decode_steps / base.cp_decode_steps
                      if base.cp_decode_steps > 0 else 0.0)


def simulate(cfg: SimConfig, ranks: list[int], modes: list[ModeSpec], et: EngineTime,
             lengths: LengthSource) -> list[Summary]:
    """All scenarios, in the order of `ranks` then `modes`."""
    return [s for r in ranks for s in run_scenario(cfg, r, modes, et, lengths)]
