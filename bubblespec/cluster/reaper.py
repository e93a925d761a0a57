"""The process between a Ray actor and its role's server: the server's whole process tree dies
with the actor.

    python -I -S .../bubblespec/cluster/reaper.py <grace-s> -- <server argv...>   (`command`)

`PR_SET_PDEATHSIG` reaches only a direct child, and vLLM's engine-core process (a child of
the rank server) outlives its parent. So the actor starts this reaper as the leader of a new
process group, with a death signal of SIGTERM (`deathsig`); the reaper runs the server in that group and:

- on SIGTERM (the actor died: `ray.kill`, Ray's memory monitor, a crash) SIGKILLs the whole
  group at once, server and engine processes alike: a real crash of the role;
- on SIGINT (the actor's graceful `stop()`) sends SIGTERM to the server, waits up to
  `grace-s`, then SIGKILLs what is left of the group;
- when the server exits on its own, SIGKILLs what it left behind and exits with its code.

Standard library only, and run by path in isolated mode (`command`), so that starting it
imports neither `bubblespec` nor site packages: nothing that could fail or slow the start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType


def command(grace_s: float, argv: list[str], python: str = sys.executable) -> list[str]:
    """The command line that runs `argv` under a reaper (`python -I -S` this file)."""
    return [python, "-I", "-S", str(Path(__file__).resolve()), str(grace_s), "--", *argv]


def _kill_group() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)  # this process included


def main(argv: list[str]) -> int:
    """Run the server of `argv` (after `--`) under the rules of the module docstring."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: reaper.py GRACE_S -- ARGV...", file=sys.stderr)
        return 2
    grace_s, cmd = float(argv[0]), argv[2:]
    server = subprocess.Popen(cmd)  # same process group as this reaper

    def crash(_sig: int, _frame: FrameType | None) -> None:
        _kill_group()

    def graceful(_sig: int, _frame: FrameType | None) -> None:
        server.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        _kill_group()

    signal.signal(signal.SIGTERM, crash)
    signal.signal(signal.SIGINT, graceful)
    code = server.wait()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for pid in _others_in_group():  # what the server left behind (engine processes)
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
