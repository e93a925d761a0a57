"""Fault drills shared by the local and the Ray cluster tests: inject a fault while a rank
provably owes its shard of the open step, and check a rollout's shape."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from bubblespec.client import BubbleSpecClient, BubbleSpecError
from bubblespec.protocol.gateway import RolloutResponse
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncError


def check_result(res: RolloutResponse, prompts: list[Any], n: int) -> None:
    assert len(res.prompts) == len(prompts)
    for i, (p, pr) in enumerate(zip(prompts, res.prompts)):
        assert pr.index == i and pr.input_ids == list(p.input_ids)
        assert [s.sample_index for s in pr.samples] == list(range(n))
        for s in pr.samples:
            assert s.output_ids and len(s.output_logprobs) == len(s.output_ids)
            assert s.finish_reason in ("stop", "length")
            assert s.completion_tokens == len(s.output_ids)
            assert s.decode_steps >= 1


def sync_state(cluster: Any) -> Any:
    async def get() -> Any:
        async with SyncClient(cluster.sync_address, timeout_s=2.0) as c:
            return await c.get_state()

    return asyncio.run(get())


def step_now(cluster: Any, tries: int = 5) -> int:
    """The synchronizer's current step (-1: none yet). A loaded machine can drop a connection
    attempt to a healthy synchronizer (seen in CI: no HTTP/2 SETTINGS frame within the 2 s
    deadline), so a failed ask is retried; the last error is raised if every try fails."""
    def ask() -> int:
        step = sync_state(cluster).current_step
        return -1 if step is None else step

    for _ in range(tries - 1):
        with contextlib.suppress(SyncError):
            return ask()
        time.sleep(0.5)
    return ask()


def owes_shard(state: Any, rank: str, after_step: int) -> bool:
    return (state.current_step is not None and state.current_step > after_step
            and state.step_open and rank in state.pending_rank_ids)


def wait_decoding(cluster: Any, rank: str, after_step: int, rollout: threading.Thread,
                   timeout_s: float = 60) -> bool:
    """Poll the synchronizer (one channel, no pause) until a step newer than `after_step` is
    open with `rank` still owing its shard; False if the rollout ended first. Asked of the
    synchronizer, not the rank: on 2 cores a decoding rank's event loop can leave HTTP
    requests unanswered for seconds."""
    async def poll() -> bool:
        deadline = time.monotonic() + timeout_s
        async with SyncClient(cluster.sync_address, timeout_s=2.0) as c:
            while time.monotonic() < deadline and rollout.is_alive():
                try:
                    if owes_shard(await c.get_state(), rank, after_step):
                        return True
                except SyncError:
                    pass
                await asyncio.sleep(0.01)
        return False

    return asyncio.run(poll())


def rollout_in_thread(client: BubbleSpecClient, **kw: Any) -> tuple[threading.Thread, dict]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = client.rollout(**kw)
        except BubbleSpecError as e:
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def fault_mid_step(client: BubbleSpecClient, cluster: Any, rank: str, fault: Callable[[], None],
                    signal_rank: Callable[[int], None] | None = None, attempts: int = 3,
                    **kw: Any) -> dict:
    """Inject `fault` while `rank` provably owes its shard, and return the rollout's outcome.

    The rank is frozen (SIGSTOP to its process group) the moment the synchronizer lists it
    as owing the open step, and the fault is injected only if the synchronizer still lists it
    once frozen: a frozen rank cannot finish, so the fault lands mid-step. The rank is then
    resumed (harmless for a killed one). Drafts can make a shard finish within the poll's
    window; then the rollout ends normally and the drill is tried again on the next step (at
    most `attempts` times). `signal_rank(sig)` signals the rank's processes (default: a
    LocalCluster child's process group)."""
    if signal_rank is None:
        def signal_rank(sig: int) -> None:
            cluster.children[rank].signal(sig, group=True)
    for _ in range(attempts):
        before = step_now(cluster)
        t, out = rollout_in_thread(client, **kw)
        if wait_decoding(cluster, rank, before, t):
            signal_rank(signal.SIGSTOP)
            try:  # never leave the rank frozen, whatever fails here
                hit = still_owes(cluster, rank, before)
                if hit:
                    fault()
            finally:
                signal_rank(signal.SIGCONT)
            if hit:
                t.join(300)
                return out
        t.join(300)
        assert "result" in out, out.get("error")
    raise AssertionError(f"{rank} finished its shard before the fault in {attempts} tries")


def still_owes(cluster: Any, rank: str, after_step: int, tries: int = 3) -> bool:
    """`owes_shard` asked again (a loaded machine can drop a connection attempt: retried);
    False when the synchronizer cannot be asked, since then nothing is proven."""
    for _ in range(tries):
        with contextlib.suppress(SyncError):
            return owes_shard(sync_state(cluster), rank, after_step)
    return False
