"""`bubblespec bench soak` (`make soak`): a long run that shows nothing grows.

A `LocalCluster` (2 ranks, the embedded model) does `--steps` rollout steps of the embedded
task with fresh prompts each step, the next step's prompts passed ahead for pre-generation,
and a weight push after every step (alternating between two copies of the model directory, so
each push is a real reload; versions 1, 2, 3...). After each step it records the resident
memory (VmRSS) of every process of the cluster (synchronizer, gateway, each rank and each
process under it: vLLM's engine core runs in a child of the rank), the draft store's fill
level and budget (synchronizer GetState), each rank's draft index against its budget (rank
`GET /v1/draft_index`), what each rank's vLLM worker memory is made of (rank `GET /v1/heap`:
anonymous and file-backed RSS, glibc's heap in use and free, forward shapes seen;
`engine/heap.py`) and the step latency. It prints a table every `--every` steps, keeps the
records so far in `<out>/soak.partial.json`, writes them to `<out>/soak.json`, plots them,
and ends with the least-squares RSS slope of each process after the warm-up, in % of its
mean RSS per 100 steps, the store and index maxima against their budgets and the workers'
memory change part by part (`soak_figures.py`).
`--task wordproblems` soaks the real model (`make real-model`) on its task instead.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bubblespec.bench.soak_figures import SoakStep, final_lines, format_rows, plot, summarize
from bubblespec.client import AsyncBubbleSpecClient
from bubblespec.cluster import LocalCluster
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncUnavailable


@dataclass(frozen=True)
class SoakConfig:
    """What `bubblespec bench soak` runs (its flags; help in `bubblespec bench soak --help`)."""

    steps: int = 200
    prompts: int = 8
    n: int = 4
    max_new_tokens: int | None = None
    temperature: float = 1.0
    seed: int = 0
    warmup: int = 20
    every: int = 10
    model: str | None = None
    out: str = "out/soak"
    task: str = "addchain"
    """The prompts' task (`bubblespec.tasks.TASKS`); without `model`, the task's model."""
    plot: str | None = None


def read_rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` in KiB (None once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return 0


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children of all its threads, recursively), ascending."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return sorted(set(found))


class ProcessTable:
    """Names the cluster's processes once and reads their RSS. A process under rank r0 is
    named after its title: `r0_enginecore` and `r0_worker` (vLLM's `VLLM::EngineCore` and
    `VLLM::Worker`), `r0_tracker` (multiprocessing's resource tracker), else `r0_child<pid>`."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.pids: dict[str, int] = {}
        for name, pid in roots.items():
            self.pids[name] = pid
            for child in descendants(pid):
                self.pids[f"{name}_{_title(_cmdline(child), child)}"] = child
        self.commands = {name: _cmdline(pid) for name, pid in self.pids.items()}

    def rss_kib(self) -> dict[str, int]:
        return {name: rss for name, pid in self.pids.items()
                if (rss := read_rss_kib(pid)) is not None}


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def _title(cmd: str, pid: int) -> str:
    if cmd.startswith("VLLM::"):
        return cmd.split()[0].removeprefix("VLLM::").lower()
    return "tracker" if "resource_tracker" in cmd else f"child{pid}"


async def _heap(cluster: LocalCluster, http: httpx.AsyncClient) -> dict[str, dict[str, int]]:
    return {r: (await http.get(url + "/v1/heap")).raise_for_status().json()
            for r, url in cluster.rank_urls.items()}


async def _index(cluster: LocalCluster, http: httpx.AsyncClient) -> dict[str, dict[str, int]]:
    return {r: (await http.get(url + "/v1/draft_index")).raise_for_status().json()
            for r, url in cluster.rank_urls.items()}


async def _poll_peak(cluster: LocalCluster, http: httpx.AsyncClient,
                     peak: dict[str, dict[str, int]], period_s: float = 1.0) -> None:
    """Until cancelled: fold each rank's index figures into `peak` (maxima)."""
    while True:
        for rank, stats in (await _index(cluster, http)).items():
            mine = peak.setdefault(rank, {})
            for k, v in stats.items():
                mine[k] = max(mine.get(k, 0), v)
        await asyncio.sleep(period_s)


async def _state(sync: SyncClient, tries: int = 3) -> Any:
    """The synchronizer's state; a monitoring read that fails once on a loaded machine is
    tried again rather than ending a long run."""
    for _ in range(tries - 1):
        try:
            return await sync.get_state(timeout_s=10)
        except SyncUnavailable:
            await asyncio.sleep(1.0)
    return await sync.get_state(timeout_s=10)


async def soak_steps(cluster: LocalCluster, cfg: SoakConfig, model_dirs: tuple[Path, Path],
                     log: Callable[[str], None] = print
                     ) -> tuple[list[SoakStep], dict[str, str]]:
    """Run `cfg.steps` steps against a started cluster: one `SoakStep` per step, and the
    command line of each named process."""
    from bubblespec.tasks import make_task

    task = make_task(cfg.task, model_dirs[0])
    sampling = {"temperature": cfg.temperature,
                "max_new_tokens": cfg.max_new_tokens or task.max_new_tokens}
    roots = {"sync": cluster.children["sync"], "gateway": cluster.children["gateway"],
             **{r: cluster.children[r] for r in cluster.rank_ids}}
    procs = ProcessTable({n: c.proc.pid for n, c in roots.items() if c.proc is not None})
    for name, cmd in procs.commands.items():
        log(f"  {name}: pid {procs.pids[name]}: {cmd}")
    records: list[SoakStep] = []
    nxt = task.make_prompts(cfg.prompts, cfg.seed)
    async with AsyncBubbleSpecClient(cluster.gateway_url, timeout_s=600) as client, \
            SyncClient(cluster.sync_address) as sync, httpx.AsyncClient(timeout=30) as http:
        await client.wait_ready(timeout_s=120)
        await _heap(cluster, http)  # the first call starts each worker's shape count
        for k in range(cfg.steps):
            prompts, nxt = nxt, task.make_prompts(cfg.prompts, cfg.seed + k + 1)
            peak: dict[str, dict[str, int]] = {}
            poll = asyncio.create_task(_poll_peak(cluster, http, peak))
            t0 = time.monotonic()
            try:
                res = await client.rollout(prompts, n=cfg.n, sampling_params=sampling,
                                           next_prompts=nxt)
            finally:
                poll.cancel()
            t1 = time.monotonic()
            store = asdict((await _state(sync)).store)  # before the push
            w = await client.update_weights(str(model_dirs[k % 2]), version=k + 1)
            t2 = time.monotonic()
            records.append(SoakStep(res.step, t1 - t0, t2 - t1, w.weight_version,
                                    res.counters.completion_tokens, procs.rss_kib(), store,
                                    await _index(cluster, http), peak,
                                    await _heap(cluster, http)))
            if (k + 1) % cfg.every == 0 or k + 1 == cfg.steps:
                log(format_rows(records[-cfg.every:], header=k < cfg.every))
                _checkpoint(Path(cfg.out), records)
    return records, procs.commands


def _checkpoint(out: Path, records: list[SoakStep]) -> None:
    """The steps so far (`<out>/soak.partial.json`): a long run that dies keeps its data."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.partial.json").write_text(json.dumps([asdict(r) for r in records]))


def run_soak(cfg: SoakConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Start a 2-rank LocalCluster, soak it, write `<out>/soak.json` (and the plot); return
    the summary (its `final_lines` are printed last)."""
    from bubblespec.tasks import task_model_dir

    src = Path(cfg.model) if cfg.model else task_model_dir(cfg.task)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bubblespec-soak-") as tmp:
        dirs = (Path(tmp) / "ckpt-a", Path(tmp) / "ckpt-b")
        for d in dirs:  # identical tensors, two paths: every push is a real reload
            shutil.copytree(src, d)
        log(f"starting a local cluster (2 ranks, model {src}); {cfg.steps} steps of "
            f"{cfg.prompts} prompts x n={cfg.n}, a weight push after each")
        with LocalCluster(ranks=2, model=str(src), log_dir=out / "logs") as cluster:
            records, commands = asyncio.run(soak_steps(cluster, cfg, dirs, log))
    summary = summarize(records, cfg.warmup)
    doc = {"config": asdict(cfg), "summary": summary, "processes": commands,
           "steps": [asdict(r) for r in records]}
    (out / "soak.json").write_text(json.dumps(doc, indent=1))
    plot_path = Path(cfg.plot) if cfg.plot else out / "soak.png"
    plot(records, summary, plot_path)
    log(f"wrote {out / 'soak.json'} and {plot_path}")
    for line in final_lines(summary):
        log(line)
    return summary
