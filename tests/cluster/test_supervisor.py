"""The supervisor of `LocalCluster`'s children, on cheap real children (`python -c ...`): a
child that exits is started again after a doubling backoff, one that keeps dying is given
up on, a held child (a fault drill's) is left alone, and nothing restarts after `stop()`."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bubblespec.cluster.child import Child
from bubblespec.cluster.local import LocalCluster
from bubblespec.cluster.supervisor import Backoff, ChildEvent, Supervisor

CRASH = [sys.executable, "-c", "import sys; sys.exit(4)"]
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def child(tmp_path: Path, name: str, argv: list[str]) -> Child:
    return Child(name, argv, tmp_path / f"{name}.log", dict(os.environ))


class Events:
    def __init__(self) -> None:
        self.items: list[ChildEvent] = []
        self._lock = threading.Lock()

    def __call__(self, ev: ChildEvent) -> None:
        with self._lock:
            self.items.append(ev)

    def kinds(self, name: str | None = None) -> list[str]:
        with self._lock:
            return [e.kind for e in self.items if name is None or e.name == name]

    def of(self, kind: str) -> list[ChildEvent]:
        with self._lock:
            return [e for e in self.items if e.kind == kind]


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")  # a zombie not yet reaped still answers kill(0)
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def test_backoff_doubles_to_its_cap_and_resets_after_a_stable_run() -> None:
    b = Backoff(first_s=1.0, max_s=30.0, stable_s=60.0)
    assert [b.after_death(5.0) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert b.after_death(60.0) == 1.0  # stayed up long enough: from the start
    assert b.after_death(0.1) == 2.0
    with pytest.raises(ValueError):
        Backoff(first_s=2.0, max_s=1.0)


def test_a_crashing_child_is_restarted_with_backoff_then_given_up(tmp_path: Path) -> None:
    crash = child(tmp_path, "crash", CRASH)
    events = Events()
    sup = Supervisor({"crash": crash}, backoff_s=0.05, backoff_max_s=0.1, stable_s=60,
                     give_up_restarts=3, give_up_window_s=60, poll_s=0.01, on_event=events)
    crash.start()
    sup.start()
    try:
        wait_for(lambda: "crash" in sup.gave_up, 60, "the supervisor to give up")
    finally:
        sup.stop()
    assert not sup.running
    assert events.kinds() == ["exited", "restarted"] * 3 + ["gave_up"]
    assert [e.delay_s for e in events.of("exited")] == [0.05, 0.1, 0.1]
    assert all(e.returncode == 4 for e in events.items)
    assert [e.restarts for e in events.of("restarted")] == [1, 2, 3]
    given = sup.gave_up["crash"]
    assert given.restarts == 3 and sup.restarts("crash") == 3
    assert "keeps dying" in given.describe() and "3 restart(s) per 60 s" in given.describe()
    assert not crash.alive  # given up: left dead


def test_a_sigkilled_child_comes_back_and_nothing_restarts_after_stop(tmp_path: Path) -> None:
    sleeper = child(tmp_path, "sleeper", SLEEP)
    events = Events()
    sup = Supervisor({"sleeper": sleeper}, backoff_s=0.05, poll_s=0.01, on_event=events)
    sleeper.start()
    sup.start()
    try:
        assert sleeper.proc is not None
        first = sleeper.proc.pid
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: events.kinds() == ["exited", "restarted"], 30, "a restart")
        assert events.items[0].returncode == -signal.SIGKILL
        assert sleeper.alive and sleeper.proc.pid != first
    finally:
        sup.stop()
    assert not sup.running
    second = sleeper.proc.pid
    sleeper.signal(signal.SIGKILL, group=True)
    sleeper.proc.wait(timeout=10)
    time.sleep(0.3)  # several poll periods: a live supervisor would have restarted it
    assert events.kinds() == ["exited", "restarted"] and sleeper.proc.pid == second
    assert not sleeper.alive


def test_a_held_child_is_left_to_the_drill(tmp_path: Path) -> None:
    """What `LocalCluster.kill` / `restart` do: hold, kill, start by hand, release; the
    supervisor starts nothing meanwhile, and watches the child again afterwards. Holding a
    child that died on its own cancels its pending restart."""
    sleeper = child(tmp_path, "sleeper", SLEEP)
    events = Events()
    sup = Supervisor({"sleeper": sleeper}, backoff_s=0.5, backoff_max_s=0.5, poll_s=0.01,
                     on_event=events)
    sleeper.start()
    sup.start()
    try:
        sup.hold("sleeper")
        sleeper.signal(signal.SIGKILL, group=True)
        sleeper.proc.wait(timeout=10)
        time.sleep(0.3)
        assert events.kinds() == [] and not sleeper.alive
        with sup.lock:
            sleeper.start()
        sup.release("sleeper")
        by_hand = sleeper.proc.pid
        time.sleep(0.1)
        assert events.kinds() == [] and sleeper.alive
        os.kill(by_hand, signal.SIGKILL)  # released: supervised again
        wait_for(lambda: events.kinds() == ["exited"], 10, "the death seen")
        sup.hold("sleeper")  # the drill takes it over during the backoff
        time.sleep(0.8)
        assert events.kinds() == ["exited"] and not sleeper.alive
    finally:
        sup.stop()


def test_cluster_stop_ends_supervision_first(tmp_path: Path) -> None:
    """`LocalCluster.stop()` returns with the supervisor's thread ended and every child gone,
    also the children the supervisor had started again."""
    cluster = LocalCluster(ranks=0, log_dir=tmp_path, grace_s=3)
    events = Events()
    for name in ("sync", "gateway"):
        cluster.children[name] = child(tmp_path, name, SLEEP)
        cluster.children[name].start()
    cluster.supervisor = Supervisor(cluster.children, backoff_s=0.05, poll_s=0.01,
                                    on_event=events).start()
    old = cluster.children["gateway"].proc.pid
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: events.kinds("gateway") == ["exited", "restarted"], 30, "a restart")
    assert cluster.restarts("gateway") == 1 and cluster.restarts("sync") == 0
    cluster.kill("sync")  # a drill's kill: held, not restarted
    time.sleep(0.3)
    assert events.kinds("sync") == [] and not cluster.children["sync"].alive
    pids = [c.proc.pid for c in cluster.children.values()]
    cluster.stop()
    assert not cluster.supervisor.running
    assert all(gone(pid) for pid in [*pids, old])
    assert events.kinds() == ["exited", "restarted"]
