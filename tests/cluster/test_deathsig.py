"""The launcher that gives a cluster's children their death signal: the child dies with the
process that started it, a child whose parent is already gone never runs its command, and
starting a child runs none of the parent's fork handlers (the hang of fresh-clone run 11: a
`preexec_fn` made CPython `fork()`, and a gRPC fork handler in the test process waited for
ever). Real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bubblespec.cluster import deathsig
from tests.cluster.helpers import REPO_ROOT

# A parent that starts `sleep` through the launcher, prints the child's pid, and waits.
PARENT = """
import subprocess, sys
from bubblespec.cluster import deathsig
p = subprocess.Popen(deathsig.command(["sleep", "300"]), start_new_session=True)
print(p.pid, flush=True)
p.wait()
"""

# A parent with a fork handler that would run if the child were started with fork():
# starts a cluster child the way LocalCluster does and reports whether the handler ran.
FORK_HANDLERS = """
import os, sys
from pathlib import Path
from bubblespec.cluster.child import Child
ran = []
os.register_at_fork(before=lambda: ran.append(1))
child = Child("c", [sys.executable, "-c", "print('child ran')"], Path(sys.argv[1]),
              dict(os.environ))
child.start()
print(child.proc.wait(), len(ran), flush=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_child_dies_with_its_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE,
                              text=True, env=_env())
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while "sleep" not in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
        assert time.monotonic() < deadline  # the launcher has exec'd sleep (same pid)
        time.sleep(0.02)
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)


def test_orphan_never_runs_its_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    wrong_parent = 1  # not this test's pid: as if the parent had died before prctl
    cmd = deathsig.command(["touch", str(marker)], parent_pid=wrong_parent)
    assert subprocess.run(cmd, check=False, timeout=30).returncode == deathsig.EXIT_ORPHANED
    assert not marker.exists()
    subprocess.run(deathsig.command(["touch", str(marker)]), check=True, timeout=30)
    assert marker.exists()


def test_missing_command_is_reported_by_the_child() -> None:
    out = subprocess.run(deathsig.command(["/nonexistent/bubblespec-x"]), check=False,
                         timeout=30, capture_output=True, text=True)
    assert out.returncode == 127
    assert "/nonexistent/bubblespec-x" in out.stderr


def test_starting_a_child_runs_no_fork_handler(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", FORK_HANDLERS, str(tmp_path / "c.log")],
                         env=_env(), capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    code, handlers_run = out.stdout.split()
    assert code == "0"
    assert handlers_run == "0", "Child.start forked with a preexec_fn: fork handlers ran"
    assert "child ran" in (tmp_path / "c.log").read_text()
