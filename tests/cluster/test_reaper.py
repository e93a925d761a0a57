"""The reaper between a Ray actor and its server: when the actor process is SIGKILLed, when the
reaper itself is SIGKILLed (what Ray does to a dying worker's children), or when a watched
process (the node's raylet) dies, the server and the processes it started (vLLM's engine
core, here a `sleep`) die with it; a graceful stop and a server's own exit are passed
through. Real processes, no Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bubblespec.cluster import reaper as reaper_mod
from tests.cluster.helpers import REPO_ROOT

# A stand-in for the actor: starts the reaper as RoleActor does (new session, death signal),
# prints the reaper's pid, then waits to be killed.
ACTOR = """
import subprocess, sys, time
from bubblespec.cluster import deathsig, reaper
watch = [int(p) for p in sys.argv[2:]]
p = subprocess.Popen(deathsig.command(reaper.command(5, ["sh", "-c", sys.argv[1]], watch=watch)),
                     start_new_session=True)
print(p.pid, flush=True)
sys.exit(p.wait())
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def _members(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    out.append(int(entry))
            except ProcessLookupError:
                continue
    return out


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split()[2] != "Z"
    except OSError:
        return False


def _start(script: str, watch: tuple[int, ...] = ()) -> tuple[subprocess.Popen, int]:
    actor = subprocess.Popen([sys.executable, "-c", ACTOR, script, *map(str, watch)],
                             stdout=subprocess.PIPE, text=True, env=_env())
    assert actor.stdout is not None
    reaper = int(actor.stdout.readline())
    deadline = time.monotonic() + 10
    while len(_members(reaper)) < 4:  # reaper, its sentinel, sh, sleep
        assert time.monotonic() < deadline, _members(reaper)
        time.sleep(0.05)
    return actor, reaper


def _all_gone(tree: list[int], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in tree):
        assert time.monotonic() < deadline, [p for p in tree if _alive(p)]
        time.sleep(0.05)


def test_actor_killed_takes_the_whole_tree() -> None:
    actor, reaper = _start("sleep 300 & wait")
    tree = _members(reaper)
    actor.kill()
    actor.wait()
    _all_gone(tree)


def test_reaper_sigkilled_the_sentinel_takes_the_whole_tree() -> None:
    """A Ray worker that exits SIGKILLs its direct children: the reaper dies without running
    a line; its sentinel kills the server and the server's children."""
    actor, reaper = _start("sleep 300 & wait")
    tree = _members(reaper)
    os.kill(reaper, signal.SIGKILL)
    _all_gone(tree)
    actor.wait(timeout=10)


def test_watched_process_dying_takes_the_whole_tree() -> None:
    """The node's raylet (here a `sleep`) dies while the actor's worker lives on: the
    sentinel sees it and kills the role's tree."""
    raylet = subprocess.Popen(["sleep", "300"])
    actor, reaper = _start("sleep 300 & wait", watch=(raylet.pid,))
    tree = _members(reaper)
    time.sleep(0.5)
    assert all(_alive(p) for p in tree)  # watching alone kills nothing
    raylet.kill()
    raylet.wait()
    _all_gone(tree)
    assert actor.wait(timeout=10) != 0


def test_a_reused_pid_is_not_the_watched_process() -> None:
    """`--watch` names a process by pid and start time: a pid whose start time differs (the
    pid reused by another process) counts as the watched process gone."""
    me = os.getpid()
    assert reaper_mod.start_time(me) and reaper_mod.start_time(10**9) == ""
    argv = reaper_mod.command(5, ["true"], watch=[me, 10**9])
    assert argv[argv.index("--watch") + 1] == f"{me}@{reaper_mod.start_time(me)}"
    code = subprocess.run([*argv[:argv.index("--watch") + 1], f"{me}@1", "--",
                           "sleep", "300"], check=False, timeout=20,
                          start_new_session=True).returncode
    assert code == -signal.SIGKILL  # the sentinel killed the group, the reaper included


def test_graceful_stop_and_exit_codes() -> None:
    actor, reaper = _start("trap 'exit 7' TERM; sleep 300 & wait")
    os.kill(reaper, signal.SIGINT)  # the actor's stop(): SIGTERM to the server, then SIGKILL
    assert actor.wait(timeout=20) != 0
    assert not any(_alive(p) for p in _members(reaper))
    actor, reaper = _start("sleep 300 & sleep 0.5; exit 3")  # the server exits on its own
    assert actor.wait(timeout=20) == 3
    time.sleep(0.2)
    assert not any(_alive(p) for p in _members(reaper))
