"""The reaper between a Ray actor and its server: when the actor process is SIGKILLed, the
server and the processes it started (vLLM's engine core, here a `sleep`) die with it; a
graceful stop and a server's own exit are passed through. Real processes, no Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.helpers import REPO_ROOT

# A stand-in for the actor: starts the reaper as RoleActor does (new session, death signal),
# prints the reaper's pid, then waits to be killed.
ACTOR = """
import subprocess, sys, time
from bubblespec.cluster import deathsig, reaper
p = subprocess.Popen(deathsig.command(reaper.command(5, ["sh", "-c", sys.argv[1]])),
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


def _start(script: str) -> tuple[subprocess.Popen, int]:
    actor = subprocess.Popen([sys.executable, "-c", ACTOR, script], stdout=subprocess.PIPE,
                             text=True, env=_env())
    assert actor.stdout is not None
    reaper = int(actor.stdout.readline())
    deadline = time.monotonic() + 10
    while len(_members(reaper)) < 3:  # reaper, sh, sleep
        assert time.monotonic() < deadline, _members(reaper)
        time.sleep(0.05)
    return actor, reaper


def test_actor_killed_takes_the_whole_tree() -> None:
    actor, reaper = _start("sleep 300 & wait")
    tree = _members(reaper)
    actor.kill()
    actor.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in tree):
        assert time.monotonic() < deadline, [p for p in tree if _alive(p)]
        time.sleep(0.05)


def test_graceful_stop_and_exit_codes() -> None:
    actor, reaper = _start("trap 'exit 7' TERM; sleep 300 & wait")
    os.kill(reaper, signal.SIGINT)  # the actor's stop(): SIGTERM to the server, then SIGKILL
    assert actor.wait(timeout=20) != 0
    assert not any(_alive(p) for p in _members(reaper))
    actor, reaper = _start("sleep 300 & sleep 0.5; exit 3")  # the server exits on its own
    assert actor.wait(timeout=20) == 3
    time.sleep(0.2)
    assert not any(_alive(p) for p in _members(reaper))
