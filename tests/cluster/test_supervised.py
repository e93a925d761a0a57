"""A supervised `LocalCluster` (the default, as under `bubblespec up`) brings its ranks back by
itself: one rank server SIGKILLed (its engine core left behind) and one rank that exits with
EXIT_ENGINE (its engine killed with no restart allowed) are started again, and a rollout
through the gateway is served by both."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from bubblespec.client import BubbleSpecClient
from bubblespec.cluster.supervisor import ChildEvent
from bubblespec.rank.service import EXIT_ENGINE
from tests.cluster.helpers import local_cluster

# a cluster of its own and two engine restarts (~1.5 min): `make test-slow`; the
# supervisor's restarts stay in `make test` (test_supervisor.py, tests/cli/test_up.py)
pytestmark = [pytest.mark.engine, pytest.mark.slow]


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def group_empty(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return all(p.status() == psutil.STATUS_ZOMBIE for p in psutil.process_iter()
               if _pgid(p.pid) == pgid)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_killed_and_exited_ranks_come_back_and_serve(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    events: list[ChildEvent] = []
    lock = threading.Lock()

    def seen(ev: ChildEvent) -> None:
        with lock:
            events.append(ev)

    def kinds(name: str) -> list[tuple[str, int | None]]:
        with lock:
            return [(e.kind, e.returncode) for e in events if e.name == name]

    gen = local_cluster(
        tmp_path_factory, sync_args=["--heartbeat-interval-s", "0.5", "--rank-timeout-s", "5"],
        rank_args=["--engine-restarts", "0", "--engine-check-s", "0.2"],
        restart_backoff_s=0.5, on_child_event=seen)
    cluster = next(gen)
    try:
        assert cluster.supervisor is not None and cluster.supervisor.running
        r0, r1 = cluster.children["r0"], cluster.children["r1"]
        assert r0.proc is not None and r1.proc is not None
        old0, old1 = r0.proc.pid, r1.proc.pid
        cores = [p for p in psutil.Process(old1).children(recursive=True)
                 if "EngineCore" in " ".join([p.name(), *p.cmdline()])]
        assert cores, "no EngineCore process under r1"
        os.kill(old0, signal.SIGKILL)  # the rank server alone: its engine core is left
        for p in cores:  # r1 may not restart its engine (0 restarts): it exits with status 4
            p.send_signal(signal.SIGKILL)
        wait_for(lambda: ("restarted", -signal.SIGKILL) in kinds("r0")
                 and ("restarted", EXIT_ENGINE) in kinds("r1"), 120, "both ranks restarted")
        assert kinds("r0")[0] == ("exited", -signal.SIGKILL)
        assert kinds("r1")[0] == ("exited", EXIT_ENGINE)
        assert "restart(s) are spent" in Path(r1.log_path).read_text()
        assert r0.proc.pid != old0 and r1.proc.pid != old1
        wait_for(lambda: group_empty(old0), 30, "r0's old process group gone")
        with BubbleSpecClient(cluster.gateway_url, timeout_s=300) as client:
            wait_for(lambda: all(r.ready and r.registered for r in client.ranks()), 600,
                     "the gateway sees both ranks again")
            from bubblespec.tasks import default_task

            res = client.rollout(default_task().make_prompts(4, 901), n=1,
                                 sampling_params={"temperature": 1.0, "max_new_tokens": 4})
        assert all(p.samples and p.samples[0].output_ids for p in res.prompts)
        assert {r.rank_id for r in res.ranks if r.num_prompts} == {"r0", "r1"}
        assert cluster.restarts("r0") == 1 and cluster.restarts("r1") == 1
        assert cluster.gave_up == {}
    finally:
        gen.close()  # stops the cluster
    assert not cluster.supervisor.running
    assert all(not c.alive for c in cluster.children.values())
