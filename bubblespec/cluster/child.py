"""`Child`: one child process of a local cluster (started with its command, environment and
log file; its liveness, log tail and signals). `LocalCluster` starts them and the
`Supervisor` restarts them; on Linux a child gets SIGTERM when its parent dies (set by the
`deathsig` launcher, not a `preexec_fn`: see there why).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bubblespec.cluster import deathsig


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a child's log file ("(no log)" if it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Child:
    """One child process of the cluster."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    """time.monotonic() of the last start."""

    def start(self) -> None:
        self.started_at = time.monotonic()
        log = open(self.log_path, "ab")  # noqa: SIM115 (kept open by the child)
        try:
            self.proc = subprocess.Popen(
                deathsig.command(self.argv), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        finally:
            log.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def signal(self, sig: int, group: bool = False) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.proc.pid, sig)
            elif self.proc.poll() is None:
                self.proc.send_signal(sig)
