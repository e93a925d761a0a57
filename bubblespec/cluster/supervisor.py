"""Supervision of `LocalCluster`'s children once the cluster is up: a child that exits is
started again.

A child that exits after the cluster started (any status: a rank whose engine restarts
are spent exits with status 4, a SIGKILLed one shows -9) is started again with the same
command, the same ports and the same log file, after an exponential backoff: `first_s`,
doubling with each death up to `max_s`, back to `first_s` once the child stayed up
`stable_s` before it died. Just before waiting, what the dead child left in its process
group (a rank's vLLM engine-core process, which would hold its memory and could hold its
port) is SIGKILLed. Meanwhile the gateway routes around a rank that is not ready, ranks
re-register with a restarted synchronizer on their next heartbeat, and clients retry a
restarting gateway.

A child that keeps dying faster than `give_up_restarts` restarts per `give_up_window_s`
(default: a death after 10 restarts within 10 minutes) is given up: it stays dead, and
`gave_up` names it (`bubblespec up` then stops the cluster and exits with its log tail).

Every exit (WARNING), restart (INFO) and give-up (ERROR) is logged (logger
`bubblespec.cluster`) and passed to the `on_event` callback. A child can be held (`hold`): the supervisor leaves it alone, dead or
alive, until `release`; `LocalCluster.kill` / `restart` (the fault drills) hold the child
they kill and release it once they started it again, so a drill and the supervisor never
both start it. `stop()` ends the supervisor thread before the cluster stops its children.

The thread that starts a child is its parent for the child's death signal
(PR_SET_PDEATHSIG follows the thread, not the process): children restarted by the
supervisor receive SIGTERM when its thread ends, i.e. at `stop()`, which is when the
cluster stops them anyway.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from bubblespec.cluster.child import Child
from bubblespec.restarts import RestartWindow

log = logging.getLogger("bubblespec.cluster")
_LEVELS = {"exited": logging.WARNING, "restarted": logging.INFO, "gave_up": logging.ERROR}


@dataclass
class Backoff:
    """The delay before restarting a child that died: `first_s`, doubled after each death up
    to `max_s`; back to `first_s` when the child had stayed up `stable_s` before dying."""

    first_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0
    _next_s: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(f"need 0 < first_s <= max_s, got {self.first_s}, {self.max_s}")
        self._next_s = self.first_s

    def after_death(self, uptime_s: float) -> float:
        """The delay before the next start of a child that died after `uptime_s` seconds up."""
        if uptime_s >= self.stable_s:
            self._next_s = self.first_s
        delay = self._next_s
        self._next_s = min(self.max_s, delay * 2)
        return delay


@dataclass(frozen=True)
class ChildEvent:
    """What happened to a supervised child."""

    name: str
    kind: Literal["exited", "restarted", "gave_up"]
    returncode: int | None
    """The exit status of the death this event is about (negative: killed by that signal)."""
    restarts: int
    """Restarts of this child by the supervisor so far (this one included for 'restarted')."""
    delay_s: float = 0.0
    """'exited': seconds until the restart."""
    uptime_s: float = 0.0
    """'exited', 'gave_up': how long the child had been up."""
    log_path: str = ""
    budget: str = ""
    """'gave_up': the restart rate it exceeded, in words."""

    def describe(self) -> str:
        if self.kind == "exited":
            return (f"{self.name} exited with code {self.returncode} after {self.uptime_s:.1f} s "
                    f"up; restarting it in {self.delay_s:g} s (log {self.log_path})")
        if self.kind == "restarted":
            return f"{self.name} restarted (restart {self.restarts})"
        return (f"{self.name} exited with code {self.returncode} after {self.uptime_s:.1f} s "
                f"up and keeps dying ({self.budget} spent); not restarting it "
                f"(log {self.log_path})")


@dataclass
class _Watch:
    backoff: Backoff
    window: RestartWindow
    due: float | None = None
    """When the dead child is started again (None: not dead, or not yet seen dead)."""
    returncode: int | None = None


class Supervisor:
    """Restart the children that exit, with backoff, until one dies too often (see module)."""

    def __init__(self, children: Mapping[str, Child], *, backoff_s: float = 1.0,
                 backoff_max_s: float = 30.0, stable_s: float = 60.0,
                 give_up_restarts: int = 10, give_up_window_s: float = 600.0,
                 poll_s: float = 0.2,
                 on_event: Callable[[ChildEvent], None] | None = None) -> None:
        self.children = children
        self.poll_s = poll_s
        self.on_event = on_event
        self._watch = {name: _Watch(Backoff(backoff_s, backoff_max_s, stable_s),
                                    RestartWindow(give_up_restarts, give_up_window_s))
                       for name in children}
        self.held: set[str] = set()
        """Children the supervisor leaves alone (a fault drill owns them)."""
        self.gave_up: dict[str, ChildEvent] = {}
        """Children given up on (dying faster than the restart rate), with their last death."""
        self.lock = threading.RLock()
        """Held while the supervisor inspects or starts a child; take it to start one by hand."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifetime
    def start(self) -> Supervisor:
        """Start watching in a background thread (children not started yet are ignored)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bubblespec-supervisor",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread; returns once it has ended, so nothing is restarted after this."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception:  # one bad pass must not end supervision (nor kill its children)
                log.exception("supervisor pass failed")

    # ------------------------------------------------------------------ drills
    def hold(self, name: str) -> None:
        """Leave `name` alone (dead or alive) until `release`; cancels a pending restart."""
        with self.lock:
            self.held.add(name)
            self._watch[name].due = None

    def release(self, name: str) -> None:
        """Supervise `name` again (it was just started by hand; one given up on is watched
        again)."""
        with self.lock:
            self.held.discard(name)
            self.gave_up.pop(name, None)
            self._watch[name].due = None

    def restarts(self, name: str) -> int:
        """Restarts of `name` by the supervisor over its lifetime."""
        return self._watch[name].window.total

    # ------------------------------------------------------------------ one pass
    def check(self) -> list[ChildEvent]:
        """One pass over the children: note the deaths, start those whose backoff is over.
        Returns (and reports) what happened."""
        events: list[ChildEvent] = []
        with self.lock:
            if self._stop.is_set():
                return events
            for name, child in self.children.items():
                if name in self.held or name in self.gave_up or child.proc is None:
                    continue
                w = self._watch[name]
                if w.due is None:
                    if child.alive:
                        continue
                    events.append(self._died(name, child, w))
                elif time.monotonic() >= w.due:
                    events.append(self._restart(name, child, w))
        for ev in events:
            log.log(_LEVELS[ev.kind], "%s", ev.describe())
            if self.on_event is not None:
                try:
                    self.on_event(ev)
                except Exception:  # a reporting error must not stop supervision
                    log.exception("on_event failed for %s", ev)
        return events

    def _died(self, name: str, child: Child, w: _Watch) -> ChildEvent:
        assert child.proc is not None
        w.returncode = child.proc.returncode
        uptime = time.monotonic() - child.started_at
        # what the child left in its process group (vLLM's engine core under a rank) goes
        # now, so that its memory and any socket it inherited are free for the new child
        child.signal(signal.SIGKILL, group=True)
        if w.window.spent():
            ev = ChildEvent(name, "gave_up", w.returncode, w.window.total, uptime_s=uptime,
                            log_path=str(child.log_path), budget=w.window.describe())
            self.gave_up[name] = ev
            return ev
        delay = w.backoff.after_death(uptime)
        w.due = time.monotonic() + delay
        return ChildEvent(name, "exited", w.returncode, w.window.total, delay_s=delay,
                          uptime_s=uptime, log_path=str(child.log_path))

    def _restart(self, name: str, child: Child, w: _Watch) -> ChildEvent:
        w.due = None
        w.window.record()  # a start that fails counts as a restart too
        try:
            child.start()
        except OSError:  # e.g. out of processes: the old, dead process stays; seen next pass
            log.exception("starting %s again failed", name)
        return ChildEvent(name, "restarted", w.returncode, w.window.total,
                          log_path=str(child.log_path))
