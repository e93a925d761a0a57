"""Start a command that dies with the process that started it, without a `preexec_fn`.

    python .../bubblespec/cluster/deathsig.py <parent-pid> -- <argv...>

Sets this process's death signal (`PR_SET_PDEATHSIG`, SIGTERM), exits at once if the parent
is already gone, then `exec`s `argv` in place: the command keeps the death signal (it
survives `execve`), the pid and the parent.

Why a launcher: a `preexec_fn` makes CPython `fork()` instead of `vfork()`, and `fork()` runs
every `pthread_atfork` handler of the parent. A process that holds gRPC channels (a test run,
a trainer driving a local cluster) has gRPC's handlers registered, and one of them can wait
for ever for gRPC's own threads: the parent hangs in `fork()`. Without `preexec_fn`, CPython
uses `vfork()`, which runs no handler.

As with any death signal, the "parent" is the thread that started the child: it fires when
that thread ends. Run by path (not `-m`): standard library only, no package import, so it
adds an interpreter start-up of a few tens of milliseconds and nothing that could fail.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
EXIT_ORPHANED = 128 + signal.SIGTERM
"""Exit status when the parent died before the death signal was set (as if it had fired)."""


def command(argv: list[str], parent_pid: int | None = None,
            python: str = sys.executable) -> list[str]:
    """`argv` wrapped so that it receives SIGTERM when the calling thread's process dies
    (Linux only; elsewhere `argv` unchanged)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    pid = os.getpid() if parent_pid is None else parent_pid
    return [python, "-I", "-S", str(Path(__file__).resolve()), str(pid), "--", *argv]


def arm(parent_pid: int) -> bool:
    """Set SIGTERM as this process's death signal; False if `parent_pid` is no longer the
    parent (it died before the signal was set, so the signal would never come)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return os.getppid() == parent_pid


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: deathsig.py PARENT_PID -- ARGV...", file=sys.stderr)
        return 2
    if not arm(int(argv[0])):
        return EXIT_ORPHANED
    cmd = argv[2:]
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:  # as subprocess would report it, but from the child
        print(f"deathsig.py: cannot run {cmd[0]!r}: {e}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
