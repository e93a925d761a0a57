"""`bubblespec up`: a child that dies during start makes the command exit non-zero with its
log tail; `--help` works and bad arguments are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cluster.helpers import REPO_ROOT


def test_up_command_exits_nonzero_with_the_log_tail(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bubblespec.cli.main", "up", "--ranks", "1", "--model",
         str(tmp_path), "--rank-arg=--no-such-flag", "--log-dir", str(tmp_path), "--grace-s", "3"],
        check=False, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "r0 exited with code 2" in r.stderr and "no-such-flag" in r.stderr


def test_up_help_and_bad_args() -> None:
    r = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "up", "--help"],
                       check=False, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 0 and "--rank-arg" in r.stdout
    r = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "up", "--ranks", "0"],
                       check=False, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 2
