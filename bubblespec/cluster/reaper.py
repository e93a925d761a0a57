"""The process between a Ray actor and its role's server: the server's whole process tree dies
with the actor, its node's raylet, or the reaper itself.

    python -I -S .../bubblespec/cluster/reaper.py <grace-s> [--watch PID@START,...] -- <argv...>

`PR_SET_PDEATHSIG` reaches only a direct child, and vLLM's engine-core process (a child of
the rank server) outlives its parent. So the actor starts this reaper as the leader of a new
process group, with a death signal of SIGTERM (`deathsig`); the reaper runs the server in that
group and:

- on SIGTERM (the actor died: `ray.kill`, Ray's memory monitor, a crash) SIGKILLs the whole
  group at once, server and engine processes alike: a real crash of the role;
- on SIGINT (the actor's graceful `stop()`) sends SIGTERM to the server, waits up to
  `grace-s`, then SIGKILLs what is left of the group;
- when the server exits on its own, SIGKILLs what it left behind and exits with its code.

The reaper can die without running any of that: when a Ray worker exits (its raylet killed,
for one), Ray SIGKILLs the worker's direct children, and the reaper is one. So the reaper also
starts a **sentinel** in the group, a child with a death signal on the reaper: when the
reaper dies, by any death, or when a watched process dies (`--watch`: the actor's worker and
its node's raylet, as pid@start-time so that a reused pid is not taken for the old process),
the sentinel SIGKILLs the group.

Standard library only, and run by path in isolated mode (`command`), so that starting it
imports neither `bubblespec` nor site packages: nothing that could fail or slow the start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

WATCH_PERIOD_S = 0.25
"""How often the sentinel looks at the watched processes."""


def command(grace_s: float, argv: list[str], python: str = sys.executable,
            watch: Sequence[int] = ()) -> list[str]:
    """The command line that runs `argv` under a reaper (`python -I -S` this file); the group
    also dies when a process of `watch` dies (those alive now; the others are left out)."""
    spec = ",".join(f"{pid}@{start}" for pid in watch if (start := start_time(pid)))
    return [python, "-I", "-S", str(Path(__file__).resolve()), str(grace_s),
            *(["--watch", spec] if spec else []), "--", *argv]


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (`/proc/PID/stat` field 22): with
    the pid it names one process for good. Empty when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return "" if fields[0] in ("Z", "X") else fields[19]


def _kill_group() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)  # this process included


def _parse_watch(spec: str) -> list[tuple[int, str]]:
    out = []
    for item in filter(None, spec.split(",")):
        pid, _, start = item.partition("@")
        out.append((int(pid), start))
    return out


def sentinel(reaper: int, watch: list[tuple[int, str]]) -> int:
    """The group's sentinel: SIGKILL the group when the reaper dies (a death signal of
    SIGTERM, armed here, and its parent pid checked after arming and at every look: the
    reaper may die before the signal is armed) or when a watched process is gone."""
    import ctypes

    signal.signal(signal.SIGTERM, lambda _s, _f: _kill_group())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the reaper's to handle
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    while True:
        if os.getppid() != reaper or any(start_time(p) != s for p, s in watch):
            _kill_group()
        time.sleep(WATCH_PERIOD_S)


def _start_sentinel(watch: str) -> subprocess.Popen:
    """The sentinel, in this process group."""
    return subprocess.Popen([sys.executable, "-I", "-S", str(Path(__file__).resolve()),
                             "--sentinel", str(os.getpid()), watch])


def main(argv: list[str]) -> int:
    """Run the server of `argv` (after `--`) under the rules of the module docstring."""
    if len(argv) == 3 and argv[0] == "--sentinel":
        return sentinel(int(argv[1]), _parse_watch(argv[2]))
    watch = ""
    if len(argv) >= 3 and argv[1] == "--watch":
        watch, argv = argv[2], [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--":
        print("usage: reaper.py GRACE_S [--watch PID@START,...] -- ARGV...", file=sys.stderr)
        return 2
    grace_s, cmd = float(argv[0]), argv[2:]

    def crash(_sig: int, _frame: FrameType | None) -> None:
        _kill_group()

    signal.signal(signal.SIGTERM, crash)
    _start_sentinel(watch)
    server = subprocess.Popen(cmd)  # same process group as this reaper

    def graceful(_sig: int, _frame: FrameType | None) -> None:
        server.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        _kill_group()

    signal.signal(signal.SIGINT, graceful)
    code = server.wait()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for pid in _others_in_group():  # what the server left behind (engine processes), sentinel too
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    return code


def _others_in_group() -> list[int]:
    """The other processes of this process group."""
    me, group, out = os.getpid(), os.getpgid(0), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                if os.getpgid(int(entry)) == group:
                    out.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
