"""`bubblespec bench control-plane`: one synchronizer daemon under the load of many ranks.

    bubblespec bench control-plane --ranks 64 --procs 2 --steps 3

Starts a daemon (its own process, as in production) and `--procs` worker processes, each
simulating `--ranks / --procs` ranks with asyncio gRPC clients (no engines), and plays the
gateway's part here. Per step, every simulated rank does what a rank does:

- at the step's start, fetches the pre-generated drafts of its prompts (the **fetch burst**:
  every rank at once, `--samples` drafts of `--draft-tokens` tokens per prompt);
- decodes its shard for a long-tailed time (lognormal around `--step-s`, the longest rank
  last), then reports done;
- in its bubble, claims pre-generation tasks for the next step (`--lanes` at a time, until
  a claim comes back empty, as a rank's pre-generation does with branches off) and
  pushes their drafts in chunks of `--chunk` tokens every `--chunk-ms`, until the stop
  fires (the last rank reported done): learnt by polling every `--poll-ms` (`--stop-by
  poll`), or pushed by the daemon on the step stream as a rank does (`--stop-by stream`,
  `WatchStep`, polling only while the stream is not live, as the rank's `StopWatch`);
- heartbeats at the daemon's interval (`--heartbeat-s`, its default 2 s) throughout,
  with the step it finished, as a rank does.

`--restart-at-step K` is the restart drill: in step K's bubble (at 0.8 `--step-s` after the
step's start: most ranks are done and pushing, the slowest still decode) the daemon is SIGKILLed and started again on the same port and its journal (`--no-journal`:
without one). The drill reports the daemon's downtime, the time until every rank's calls
reach the new daemon, whether the step completed, and every complete draft a rank had
acknowledged that the next step's fetch does not find (lost), before and after the kill.

What it measures: per call kind, the count and latency p50 / p99 as the ranks see them;
calls per second the daemon served; the **stop latency** (from the last rank's report to
each rank seeing the stop, p50 / p99 / max); the fetch burst's time to the last rank; the
daemon's CPU (seconds of CPU per wall second, from /proc) and peak RSS. `requirement`
scales the call rates linearly to other rank counts (the same per-rank call pattern) and
charges each call the daemon CPU measured per call here: the CPU one daemon would need, and
whether one core (one Python process) covers it.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import random
import re
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bubblespec.bench.sync_latency import start_daemon
from bubblespec.protocol.domain import (
    DraftStatus,
    PregenDraft,
    PregenTask,
    RankStatus,
    StepEventKind,
)
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncError
from bubblespec.synchronizer.peer import DraftPeerServer, PeerDrafts, PeerReader

PROMPT_TOKENS = 256


@dataclass(frozen=True)
class ControlPlaneConfig:
    """What `bubblespec bench control-plane` runs (its flags)."""

    ranks: int = 32
    procs: int = 2
    steps: int = 3
    prompts_per_rank: int = 2
    samples: int = 8
    draft_tokens: int = 512
    step_s: float = 3.0
    lanes: int = 16
    chunk: int = 64
    chunk_ms: float = 80.0
    poll_ms: float = 80.0
    stop_by: str = "poll"
    """How a rank in its bubble learns of the stop: `poll` (PollStop every `poll_ms`) or
    `stream` (the daemon pushes it on WatchStep)."""
    restart_at_step: int = -1
    """SIGKILL the daemon in this step's bubble and start it again (the drill); -1: never."""
    journal: bool = True
    """The daemon keeps a journal (`--journal-path`, as `bubblespec up` runs it)."""
    heartbeat_s: float = 2.0
    """The daemon's heartbeat interval (its `--heartbeat-interval-s`), which ranks follow."""
    lane_tokens_per_s: float = 0.0
    """0: the stress pattern (every lane pushes `chunk` tokens every `chunk_ms`). Above 0:
    a rank's pattern (`rank/pregen.py`, branches off): each lane decodes at this many tokens
    per second and pushes its draft once, when complete, and the partial drafts go in one
    batch at the stop."""
    drafts_from: str = "synchronizer"
    """Where the fetch burst reads draft bytes: `synchronizer`, or `peers` (each worker
    process serves the drafts its ranks pushed, `synchronizer/peer.py`, as ranks with
    `--drafts-port` do; the daemon's FetchDrafts only says where)."""
    seed: int = 0
    out: str = ""


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def _key(step: int, p: int) -> str:
    return f"s{step}p{p}"


class _Rank:
    """One simulated rank: its calls, timed, and the step's events."""

    def __init__(self, rank_id: str, client: SyncClient, cfg: ControlPlaneConfig,
                 calls: dict[str, list[float]]) -> None:
        self.id, self.c, self.cfg, self.calls = rank_id, client, cfg, calls
        self.done_step: int | None = None
        """The newest step it finished: its heartbeats say so (a lost report heals)."""

    async def _timed(self, kind: str, coro: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await coro
        finally:
            self.calls.setdefault(kind, []).append(time.perf_counter() - t0)

    async def step(self, step: int, prompts: list[str], decode_s: float) -> dict[str, float]:
        cfg = self.cfg
        t_start = time.time()
        if step > 0:
            await self._timed("FetchDrafts", self.c.fetch_drafts(step, prompts))
        t_fetched = time.time()
        await asyncio.sleep(decode_s)
        t_done = time.time()
        self.done_step = step
        stop = await self._timed("ReportDone", self.c.report_done(step, self.id))
        pushes: dict[tuple[str, int], int] = {}  # lane -> tokens pushed (dt: finished)
        started: dict[tuple[str, int], float] = {}  # lane -> when it was claimed
        acked: list[tuple[str, int, float]] = []  # complete drafts stored: key, index, when
        last_poll = 0.0
        pushed = asyncio.Event()
        watcher = None
        live = [False]  # the step stream delivers (stream mode): no polls meanwhile
        if cfg.stop_by == "stream" and not stop:
            async def watch() -> None:
                def on_live(up: bool) -> None:
                    live[0] = up

                events = self.c.watch_step(step, self.id, on_live=on_live)
                async for ev in events:
                    if ev.step > step or ev.kind is not StepEventKind.OPENED:
                        break
                await events.aclose()
                self.calls.setdefault("WatchStep", []).append(0.0)
                pushed.set()
            watcher = asyncio.create_task(watch())
        exhausted = False  # as a rank (branches off): no more claims once one came back empty
        while not stop:
            if len(pushes) < cfg.lanes and not exhausted:
                claim = await self._timed("ClaimTasks", self.c.claim_tasks(
                    step, self.id, cfg.lanes - len(pushes)))
                for t in claim.tasks:
                    pushes[(t.prompt_key, t.sample_index)] = 0
                    started[(t.prompt_key, t.sample_index)] = time.monotonic()
                stop = stop or claim.stop
                exhausted = not claim.tasks
            drafts = (self._finished(pushes, started) if cfg.lane_tokens_per_s > 0
                      else self._chunks(pushes))
            if drafts:
                res = await self._timed("PushDrafts",
                                        self.c.push_drafts(step + 1, self.id, drafts))
                now = time.time()
                for d, st in zip(drafts, res.statuses):
                    key = (d.prompt_key, d.sample_index)
                    if st is DraftStatus.STORED:
                        if d.complete:
                            acked.append((*key, now))
                    elif st is DraftStatus.UNAVAILABLE:  # the daemon is down: send it again
                        pushes[key] = d.offset
                    elif st is DraftStatus.REJECTED_GAP:  # it lost the start: from 0
                        pushes[key] = 0
                    else:  # not taken (step over, store full): give it up
                        pushes.pop(key, None)
            for k in [k for k, d in pushes.items() if d >= cfg.draft_tokens]:
                del pushes[k]
            for k in [k for k in started if k not in pushes]:
                del started[k]
            if pushed.is_set():
                stop = True
            elif ((cfg.stop_by == "poll" or not live[0])
                  and time.monotonic() - last_poll >= cfg.poll_ms / 1000):
                last_poll = time.monotonic()
                stop = stop or await self._timed("PollStop", self.c.poll_stop(step, self.id))
            if not stop:
                try:
                    await asyncio.wait_for(pushed.wait(), cfg.chunk_ms / 1000)
                except asyncio.TimeoutError:
                    pass
        saw_stop = time.time()
        if watcher is not None:
            watcher.cancel()
        if cfg.lane_tokens_per_s > 0 and started:  # as a rank: the partial drafts at the stop
            drafts = self._finished(pushes, started, at_stop=True)
            if drafts:
                res = await self._timed("PushDrafts",
                                        self.c.push_drafts(step + 1, self.id, drafts))
                acked += [(d.prompt_key, d.sample_index, time.time())
                          for d, st in zip(drafts, res.statuses)
                          if d.complete and st is DraftStatus.STORED]
        return {"start": t_start, "fetched": t_fetched, "done": t_done, "saw_stop": saw_stop,
                "acked": acked}

    def _chunks(self, pushes: dict[tuple[str, int], int]) -> list[PregenDraft]:
        """The stress pattern: the next `chunk` tokens of every lane."""
        cfg, drafts = self.cfg, []
        for k, done in list(pushes.items()):
            if done >= cfg.draft_tokens:
                continue
            n = min(cfg.chunk, cfg.draft_tokens - done)
            drafts.append(PregenDraft(k[0], k[1], list(range(done, done + n)),
                                      complete=done + n >= cfg.draft_tokens, offset=done))
            pushes[k] = done + n
        return drafts

    def _finished(self, pushes: dict[tuple[str, int], int],
                  started: dict[tuple[str, int], float], at_stop: bool = False
                  ) -> list[PregenDraft]:
        """A rank's pattern (`rank/pregen.py`): each lane decodes at `lane_tokens_per_s`
        and pushes its draft once, when complete, or, `at_stop`, as far as it got."""
        cfg, now, drafts = self.cfg, time.monotonic(), []
        for k, t0 in started.items():
            n = min(cfg.draft_tokens, int((now - t0) * cfg.lane_tokens_per_s))
            if pushes.get(k, cfg.draft_tokens) < cfg.draft_tokens and (
                    n >= cfg.draft_tokens or (at_stop and n > 0)):
                drafts.append(PregenDraft(k[0], k[1], list(range(n)),
                                          complete=n >= cfg.draft_tokens))
                pushes[k] = cfg.draft_tokens
        return drafts


async def _worker_main(conn: Any, address: str, rank_ids: list[str],
                       cfg: ControlPlaneConfig) -> None:
    calls: dict[str, list[float]] = {}
    async with SyncClient(address, timeout_s=30.0) as c:
        await c.wait_ready(30.0)
        server = None
        if cfg.drafts_from == "peers":  # this process serves its ranks' drafts
            drafts = PeerDrafts()
            server = DraftPeerServer(drafts)
            c.serve_drafts(drafts, await server.start(), PeerReader(timeout_s=30.0))
        ranks = [_Rank(r, c, cfg, calls) for r in rank_ids]
        for r in ranks:
            await r._timed("RegisterRank", c.register(r.id, f"http://{r.id}"))
        halt = asyncio.Event()

        async def beats(r: _Rank) -> None:
            while not halt.is_set():
                reg = c.registration.get(r.id)  # the daemon's interval, as a rank uses it
                period = reg.heartbeat_interval_s if reg else 1.0
                try:
                    await r._timed("Heartbeat",
                                   c.heartbeat(r.id, RankStatus(done_step=r.done_step)))
                except SyncError:  # the daemon is down (the restart drill): as a rank's
                    period = 0.25  # `run_heartbeats`, retry sooner
                try:
                    await asyncio.wait_for(halt.wait(), period)
                except asyncio.TimeoutError:
                    pass

        hb = [asyncio.create_task(beats(r)) for r in ranks]
        conn.send("ready")
        while True:
            msg = await asyncio.to_thread(conn.recv)
            if msg is None:
                break
            step, plan = msg  # plan: rank id -> (its prompts, its decode seconds)
            calls.clear()
            peer0 = c.peer_tokens_fetched
            events = await asyncio.gather(*(r.step(step, *plan[r.id]) for r in ranks))
            conn.send({"events": dict(zip(rank_ids, events)), "calls": calls,
                       "peer_tokens": c.peer_tokens_fetched - peer0})
        halt.set()
        await asyncio.gather(*hb)
        if server is not None:
            await server.stop(0)


def _worker(conn: Any, address: str, rank_ids: list[str], cfg: ControlPlaneConfig) -> None:
    asyncio.run(_worker_main(conn, address, rank_ids, cfg))


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class _Daemon:
    """The daemon process, which the restart drill replaces."""

    def __init__(self, journal: str | None, heartbeat_s: float) -> None:
        self.args = (("--journal-path", journal) if journal else ()) + (
            "--heartbeat-interval-s", str(heartbeat_s))
        self.proc, self.address, _ = start_daemon(*self.args)
        self.port = int(self.address.rsplit(":", 1)[1])

    def kill_and_restart(self) -> tuple[float, float]:
        """SIGKILL, then a new daemon on the same port and journal; (killed, up) times."""
        self.proc.kill()
        self.proc.wait(30)
        killed = time.time()
        self.log: list[str] = []
        self.proc, _, _ = start_daemon(*self.args, port=self.port, log=self.log)
        return killed, time.time()

    def replay_s(self) -> float | None:
        """Seconds the restarted daemon spent replaying its journal (from its log)."""
        for line in self.log:
            m = re.search(r"requests replayed \(\d+ refused\) in ([0-9.]+) s", line)
            if m:
                return float(m.group(1))
        return None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def _drill(gw: SyncClient, daemon: _Daemon, at_s: float, rank_ids: list[str]
                 ) -> dict[str, Any]:
    """Kill and restart the daemon `at_s` from now; then wait until every rank was heard by
    the new one (a heartbeat, at most one interval after it is up)."""
    await asyncio.sleep(at_s)
    killed, up = await asyncio.to_thread(daemon.kill_and_restart)
    snap = await gw.get_state()
    restored = {"step": snap.current_step, "ranks": len(snap.ranks),
                "drafts": snap.store.sequences, "tokens": snap.store.tokens}
    while True:
        snap = await gw.get_state()
        heard = time.time() - up
        if (len(snap.ranks) >= len(rank_ids)
                and all(r.last_heartbeat_age_s < heard for r in snap.ranks)):
            break
        await asyncio.sleep(0.05)
    return {"killed": killed, "downtime_s": up - killed, "replay_s": daemon.replay_s(),
            "ranks_back_s": time.time() - killed, "restored": restored}


async def _drive(cfg: ControlPlaneConfig, conns: list[Any], groups: list[list[str]],
                 daemon: _Daemon, worker_pids: list[int]) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    rank_ids = [r for g in groups for r in g]
    per_rank = cfg.prompts_per_rank
    steps_out = []
    async with SyncClient(daemon.address, timeout_s=60.0) as gw:
        for step in range(cfg.steps):
            nxt = [PregenTask(_key(step + 1, p), list(range(PROMPT_TOKENS)), s, p * 64 + s,
                              SamplingParams(max_new_tokens=cfg.draft_tokens))
                   for p in range(per_rank * len(rank_ids)) for s in range(cfg.samples)]
            await gw.open_step(step, {r: per_rank * cfg.samples for r in rank_ids}, nxt)
            # long-tailed decode times; the last rank's is the step's length
            times = sorted(rng.lognormvariate(0.0, 0.5) for _ in rank_ids)
            scale = cfg.step_s / times[-1]
            order = rank_ids[:]
            rng.shuffle(order)
            plan = {r: ([_key(step, i * per_rank + p) for p in range(per_rank)],
                        times[j] * scale) for i, r in enumerate(rank_ids)
                    for j in [order.index(r)]}
            pid = daemon.proc.pid
            cpu0, t0 = _proc_cpu_s(pid), time.time()
            ranks_cpu0 = sum(_proc_cpu_s(w) for w in worker_pids)
            drill = None
            if step == cfg.restart_at_step:  # mid-bubble: most ranks are done, drafts stored
                drill = asyncio.create_task(_drill(gw, daemon, 0.8 * cfg.step_s, rank_ids))
            for conn, g in zip(conns, groups):
                conn.send((step, {r: plan[r] for r in g}))
            replies = [await asyncio.to_thread(conn.recv) for conn in conns]
            wall = time.time() - t0
            cpu = _proc_cpu_s(pid) - cpu0 if daemon.proc.pid == pid else float("nan")
            ranks_cpu = sum(_proc_cpu_s(w) for w in worker_pids) - ranks_cpu0
            events = {k: v for rep in replies for k, v in rep["events"].items()}
            calls: dict[str, list[float]] = {}
            for rep in replies:
                for k, v in rep["calls"].items():
                    calls.setdefault(k, []).extend(v)
            last_done = max(e["done"] for e in events.values())
            stop_lat = [e["saw_stop"] - last_done for e in events.values()]
            restart = None
            if drill is not None:
                restart = await drill
                restart["lost"] = await _lost(gw, step, events, restart.pop("killed"))
            steps_out.append({
                "restart": restart,
                "fetch_peer_tokens": sum(rep["peer_tokens"] for rep in replies),
                "step": step, "wall_s": wall, "daemon_cpu_s": cpu, "ranks_cpu_s": ranks_cpu,
                "daemon_cpu_per_wall": cpu / wall, "daemon_rss_mib": _proc_rss_mib(daemon.proc.pid),
                "fetch_burst_s": (max(e["fetched"] for e in events.values())
                                  - min(e["start"] for e in events.values())) if step else None,
                "stop_latency_s": {"p50": _pct(stop_lat, 0.5), "p99": _pct(stop_lat, 0.99),
                                   "max": max(stop_lat)},
                "calls": {k: {"n": len(v), "per_s": len(v) / wall,
                              "p50_ms": 1e3 * _pct(v, 0.5), "p99_ms": 1e3 * _pct(v, 0.99)}
                          for k, v in sorted(calls.items())},
            })
            if step > 0:
                try:
                    await gw.close_step(step - 1)
                except SyncError:  # a daemon restarted without a journal forgot the step
                    if cfg.journal or not 0 <= cfg.restart_at_step <= step:
                        raise
    return {"steps": steps_out}


def run(cfg: ControlPlaneConfig) -> dict[str, Any]:
    """Start the daemon and the workers, run the steps, print and return the figures."""
    if cfg.ranks < 1 or cfg.procs < 1 or cfg.steps < 2:
        raise ValueError("control-plane: ranks and procs >= 1, steps >= 2")
    tmp = tempfile.TemporaryDirectory(prefix="bubblespec-cp-")
    daemon = _Daemon(os.path.join(tmp.name, "sync.journal") if cfg.journal else None,
                     cfg.heartbeat_s)
    ctx = mp.get_context("spawn")
    groups = [[f"r{i}" for i in range(k, cfg.ranks, cfg.procs)] for k in range(cfg.procs)]
    groups = [g for g in groups if g]
    conns, workers = [], []
    try:
        for g in groups:
            here, there = ctx.Pipe()
            w = ctx.Process(target=_worker, args=(there, daemon.address, g, cfg), daemon=True)
            w.start()
            conns.append(here)
            workers.append(w)
        for conn in conns:
            if not conn.poll(120) or conn.recv() != "ready":
                raise RuntimeError("a worker did not register its ranks in time")
        out = asyncio.run(_drive(cfg, conns, groups, daemon, [w.pid for w in workers]))
        for conn in conns:
            conn.send(None)
        for w in workers:
            w.join(30)
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
        daemon.stop()
        tmp.cleanup()
    summary = summarize([s for s in out["steps"] if s["restart"] is None], cfg.ranks)
    if cfg.drafts_from == "peers":
        summary["locate_s_per_draft"] = locate_cost(cfg)
    out = {"config": asdict(cfg), **out, "summary": summary,
           "requirement": [requirement(cfg, summary, n) for n in (64, 1024)]}
    print(format_lines(out))
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(out, indent=2))
    return out


async def _lost(gw: SyncClient, step: int, events: dict[str, Any], killed: float
                ) -> dict[str, int]:
    """Complete drafts for step + 1 the ranks had acknowledged, and those of them the
    restarted daemon does not hand out, acknowledged before the kill and after."""
    acked = [(k, i, t) for e in events.values() for k, i, t in e["acked"]]
    keys = sorted({k for k, _, _ in acked})
    have = {(d.prompt_key, d.sample_index)
            for d in await gw.fetch_drafts(step + 1, keys) if d.complete}
    before = [(k, i) for k, i, t in acked if t < killed]
    after = [(k, i) for k, i, t in acked if t >= killed]
    return {"acked_before_kill": len(before), "lost_before_kill": len(set(before) - have),
            "acked_after_restart": len(after), "lost_after_restart": len(set(after) - have)}


def summarize(steps: list[dict[str, Any]], ranks: int) -> dict[str, Any]:
    """Figures over the steps after step 0 (step 0 has nothing to fetch)."""
    later = steps[1:]
    per_step = sum(c["n"] for s in later for k, c in s["calls"].items() if k != "Heartbeat")
    beats = sum(s["calls"].get("Heartbeat", {}).get("n", 0) for s in later)
    kinds = sorted({k for s in later for k in s["calls"]})
    wall = sum(s["wall_s"] for s in later)
    calls = {k: {"per_s": sum(s["calls"].get(k, {}).get("n", 0) for s in later) / wall,
                 "p50_ms": statistics.median(s["calls"][k]["p50_ms"] for s in later
                                             if k in s["calls"]),
                 "p99_ms": max(s["calls"][k]["p99_ms"] for s in later if k in s["calls"])}
             for k in kinds}
    return {"calls": calls, "calls_per_s": sum(c["per_s"] for c in calls.values()),
            "calls_per_rank_step": per_step / len(later) / ranks,
            "heartbeats_per_rank_s": beats / wall / ranks,
            "daemon_cpu_per_wall": sum(s["daemon_cpu_s"] for s in later) / wall,
            "ranks_cpu_s_per_step": sum(s.get("ranks_cpu_s", 0.0) for s in later) / len(later),
            "daemon_rss_mib": max(s["daemon_rss_mib"] for s in steps),
            "fetch_burst_s": max(s["fetch_burst_s"] for s in later),
            "fetch_peer_tokens": sum(s.get("fetch_peer_tokens", 0) for s in later),
            "stop_latency_p99_s": max(s["stop_latency_s"]["p99"] for s in later),
            "stop_latency_max_s": max(s["stop_latency_s"]["max"] for s in later)}


def locate_cost(cfg: ControlPlaneConfig, repeats: int = 5) -> float:
    """Seconds of the daemon's work per located draft in a FetchDrafts with `locate` (the
    store's lookup and the reply built and serialized), in this process on one core: a
    rank's fetch of `prompts_per_rank` prompts x `samples` drafts, each held by a serving
    rank. The median of `repeats` fetches of every rank's prompts."""
    from bubblespec.rpc.v1 import synchronizer_pb2 as pb
    from bubblespec.synchronizer import convert as cv
    from bubblespec.synchronizer.store import DraftStore

    store = DraftStore(1 << 40)
    keys = [_key(1, p) for p in range(cfg.ranks * cfg.prompts_per_rank)]
    owners = [f"r{i}" for i in range(cfg.ranks)]
    for p, k in enumerate(keys):
        for s in range(cfg.samples):
            store.put(1, PregenDraft(k, s, [7] * cfg.draft_tokens, True),
                      owners[(p * cfg.samples + s) % cfg.ranks])
    peers = {o: f"10.0.0.1:{7000 + i}" for i, o in enumerate(owners)}
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(0, len(keys), cfg.prompts_per_rank):
            _, located, named, _ = store.locate(1, keys[i : i + cfg.prompts_per_rank], peers)
            pb.FetchDraftsResponse(
                located=[cv.located_to_pb(k, a) for k, a in located], owners=named,
                owner_addresses=[peers[o] for o in named]).SerializeToString()
        times.append((time.perf_counter() - t0) / (len(keys) * cfg.samples))
    return statistics.median(times)


def requirement(cfg: ControlPlaneConfig, summary: dict[str, Any], ranks: int
                ) -> dict[str, float]:
    """The measured pattern at `ranks` ranks: calls per second (linear in the ranks) and the
    daemon CPU they need at the CPU per call measured here (core-seconds per second: above
    1, one Python daemon cannot keep up)."""
    per_call = summary["daemon_cpu_per_wall"] / max(summary["calls_per_s"], 1e-9)
    calls = summary["calls_per_s"] * ranks / cfg.ranks
    return {"ranks": ranks, "calls_per_s": calls, "daemon_cpu_per_call_ms": 1e3 * per_call,
            "daemon_cores_needed": calls * per_call}


def format_lines(out: dict[str, Any]) -> str:
    cfg, s = out["config"], out["summary"]
    lines = [(f"control plane: {cfg['ranks']} ranks in {cfg['procs']} processes, one daemon, "
             f"{cfg['steps']} steps (figures over steps 1..)"),
             f"{'call':<14}{'per s':>10}{'p50 ms':>10}{'p99 ms':>10}"]
    for k, c in s["calls"].items():
        lines.append(f"{k:<14}{c['per_s']:>10.1f}{c['p50_ms']:>10.2f}{c['p99_ms']:>10.2f}")
    lines += [(f"all calls: {s['calls_per_s']:.0f}/s; daemon CPU {s['daemon_cpu_per_wall']:.2f} "
              f"s per wall s, peak RSS {s['daemon_rss_mib']:.0f} MiB; the simulated ranks' "
              f"processes {s.get('ranks_cpu_s_per_step', 0.0):.2f} CPU s per step"),
              (f"fetch burst to the last rank: {s['fetch_burst_s'] * 1e3:.0f} ms"
               + (f" ({s['fetch_peer_tokens']} draft tokens read from the ranks that pushed "
                  f"them; the daemon's part {s['locate_s_per_draft'] * 1e6:.1f} us per "
                  f"located draft)" if cfg.get("drafts_from") == "peers" else "")
               + f"; stop latency "
              f"p99 {s['stop_latency_p99_s'] * 1e3:.0f} ms, max "
              f"{s['stop_latency_max_s'] * 1e3:.0f} ms ("
              + (f"poll every {cfg['poll_ms']:.0f} ms)" if cfg["stop_by"] == "poll"
                 else "pushed on the step stream)"))]
    for st in out["steps"]:
        d = st["restart"]
        if d is None:
            continue
        lost, got = d["lost"], d["restored"]
        lines += [(f"restart drill at step {st['step']} ("
                   f"{'journal' if cfg['journal'] else 'NO journal'}): daemon down "
                   f"{d['downtime_s']:.2f} s (replay {d['replay_s'] or 0:.2f} s), every rank heard again {d['ranks_back_s']:.2f} s "
                   f"after the kill; restored step {got['step']}, {got['ranks']} ranks, "
                   f"{got['drafts']} drafts; the step completed (stop p99 "
                   f"{st['stop_latency_s']['p99'] * 1e3:.0f} ms after the last report)"),
                  (f"  complete drafts acknowledged before the kill: {lost['acked_before_kill']}"
                   f", lost {lost['lost_before_kill']}; after the restart: "
                   f"{lost['acked_after_restart']}, lost {lost['lost_after_restart']}")]
    for r in out.get("requirement", []):
        lines.append(f"the same pattern at {r['ranks']} ranks: {r['calls_per_s']:.0f} calls/s, "
                     f"{r['daemon_cores_needed']:.2f} daemon cores at "
                     f"{r['daemon_cpu_per_call_ms']:.3f} ms CPU per call (linear scaling)")
    return "\n".join(lines)
