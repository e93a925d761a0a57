"""The Ray actors of a `RayCluster`: each hosts one role's server as a child process.

A `RoleActor` (subclassed per role so that the Ray dashboard lists `SyncActor`, `RankActor`
and `GatewayActor` by class) starts `python -m bubblespec.cli.main <role> ...`, the same
command `LocalCluster` and the containers run, and supervises it:

- the child is a reaper (`reaper.py`) leading its own process group, with a death signal:
  a `ray.kill(actor)` (Ray SIGKILLs the worker) makes it SIGKILL the server and its engine
  processes at once, a real crash of the role, which the gateway's shard re-run and the
  synchronizer's recovery must handle; the reaper's sentinel watches the actor's worker and
  the node's raylet as well, so the role dies with its node agent too (when a raylet dies,
  its workers exit and Ray SIGKILLs their children, the reaper among them, before it can act);
- a watcher thread ends the actor's process when the child exits on its own (a rank whose
  engine restarts are spent exits non-zero for its supervisor to replace it), so Ray's
  `max_restarts` replaces the role either way;
- the ports and the child's process group are kept in a small state file on the node,
  keyed by the cluster's run id: a restarted actor (same node: ranks are pinned to their
  placement-group bundle, synchronizer and gateway to the driver's node) kills whatever its
  predecessor left behind (vLLM's engine process) and serves on the same ports, so the
  gateway's rank list and the ranks' synchronizer address stay valid;
- ranks find the synchronizer by its actor name (`RoleSpec.sync_actor`), not by a
  configured host:port.

Every server binds 0.0.0.0 (127.0.0.1 on a node whose Ray address is loopback: a Ray of
one host, test traffic stays there) and advertises the node's IP; each still serves `/metrics`
(the synchronizer on its metrics port) for the existing Prometheus rules. With
`RoleSpec.tls` the server runs with mutual TLS, from PEM files the actor writes on its node.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bubblespec.cluster import deathsig, reaper
from bubblespec.cluster.child import log_tail
from bubblespec.cluster.local import CHILD_ENV, free_ports


@dataclass(frozen=True)
class RoleSpec:
    """What one actor runs: its role, name and arguments (the same on every restart)."""

    role: str
    """`sync`, `rank` or `gateway` (the `bubblespec` subcommand)."""
    name: str
    """Actor name and log name: `sync`, `r0`..., `gateway`."""
    run_id: str
    """Identifies one cluster; keys the state files of its actors."""
    args: tuple[str, ...] = ()
    """Extra arguments for the subcommand."""
    ports: tuple[int, ...] = ()
    """Fixed ports (server, then metrics for the synchronizer); empty: free ports."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the child."""
    sync_actor: str = ""
    """Name of the synchronizer's actor, for the roles that call it."""
    namespace: str = "bubblespec"
    grace_s: float = 10.0
    """SIGTERM -> SIGKILL grace period of a graceful stop."""
    state_dir: str = ""
    """Where state and logs go on the node [a temp dir per run id]."""
    tls: tuple[tuple[str, str], ...] = ()
    """Mutual TLS: the PEM texts of the CA, the certificate and its key, as (`ca`|`cert`|`key`,
    text); the actor writes them under its state dir (the key 0600) and the server gets the
    `--tls-*` flags. Empty: plaintext."""


class RoleActor:
    """Hosts one role's server process; see the module docstring for the lifecycle."""

    def __init__(self, spec: RoleSpec) -> None:
        import ray

        self.spec = spec
        self.ip = ray.util.get_node_ip_address()
        self.bind = "127.0.0.1" if ipaddress.ip_address(self.ip).is_loopback else "0.0.0.0"
        self.node_id = ray.get_runtime_context().get_node_id()
        base = spec.state_dir or os.path.join("/tmp", "bubblespec-ray", spec.run_id)
        self.dir = Path(base)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / f"{spec.name}.log"
        state = self._load_state()
        if state.get("pgid"):  # what a killed predecessor left behind (engine processes)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(state["pgid"]), signal.SIGKILL)
        self.incarnation = int(state.get("incarnation", -1)) + 1
        if spec.role == "sync" and self.incarnation == 0:  # a new cluster: an empty journal
            self._journal().unlink(missing_ok=True)
        want = 2 if spec.role == "sync" else 1
        ports = state.get("ports") or spec.ports or free_ports(want, self.bind)
        self.ports: list[int] = list(ports)
        self.sync_address = self._find_sync() if spec.sync_actor else ""
        self.tls_files = self._write_tls()
        self._stopping = False
        self.proc = self._start_child()
        self._save_state()
        threading.Thread(target=self._watch, name="bubblespec-child-watch", daemon=True).start()

    # ------------------------------------------------------------------ state

    def _state_path(self) -> Path:
        return self.dir / f"{self.spec.name}.state.json"

    def _journal(self) -> Path:
        """The synchronizer's journal: a restart on this node replays it (one on another
        node starts empty, as a synchronizer without a journal)."""
        return self.dir / f"{self.spec.name}.journal"

    def _load_state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self._state_path().read_text()))
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        tmp = self._state_path().with_suffix(".tmp")
        tmp.write_text(json.dumps({"ports": self.ports, "pgid": self.proc.pid,
                                   "incarnation": self.incarnation}))
        tmp.replace(self._state_path())

    # ------------------------------------------------------------------ the child

    def _find_sync(self, timeout_s: float = 60.0) -> str:
        """The synchronizer's host:port, asked of its named actor (it may be restarting)."""
        import ray

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                actor = ray.get_actor(self.spec.sync_actor, namespace=self.spec.namespace)
                return str(ray.get(actor.address.remote(), timeout=10))
            except (ValueError, ray.exceptions.RayError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _write_tls(self) -> dict[str, str]:
        """The TLS files of this node (`RoleSpec.tls`), written once per actor; {} without."""
        if not self.spec.tls:
            return {}
        d = self.dir / "tls"
        d.mkdir(parents=True, exist_ok=True)
        out = {}
        for kind, text in self.spec.tls:
            path = d / f"{self.spec.name}-{kind}.pem"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            out[kind] = str(path)
        return out

    def _argv(self) -> list[str]:
        s, port = self.spec, str(self.ports[0])
        argv = [sys.executable, "-m", "bubblespec.cli.main", s.role, "--host", self.bind,
                "--port", port]
        if s.role == "sync":
            argv += ["--metrics-host", self.bind, "--metrics-port", str(self.ports[1]),
                     "--journal-path", str(self._journal())]
        elif s.role == "rank":
            argv += ["--rank-id", s.name, "--advertise-address", f"{self.ip}:{port}",
                     "--sync-address", self.sync_address]
        else:
            argv += ["--sync-address", self.sync_address]
        if self.tls_files:
            t = self.tls_files
            argv += ["--tls-ca", t["ca"], "--tls-cert", t["cert"], "--tls-key", t["key"],
                     "--tls-client-auth"]
        return [*argv, *s.args]

    def _start_child(self) -> subprocess.Popen:
        env = {**CHILD_ENV, **os.environ, **self.spec.env}
        root = str(Path(__file__).resolve().parents[2])  # a checkout without `pip install -e`
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        with open(self.log_path, "ab") as log:
            log.write(f"--- incarnation {self.incarnation}: {' '.join(self._argv())}\n".encode())
            log.flush()
            watch = [os.getpid(), *raylet_pid()]
            return subprocess.Popen(  # the reaper dies with the actor (deathsig: no preexec_fn)
                deathsig.command(reaper.command(self.spec.grace_s, self._argv(), watch=watch)),
                stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)

    def _watch(self) -> None:
        code = self.proc.wait()
        if not self._stopping:  # the role died on its own: let Ray replace this actor
            with contextlib.suppress(OSError), open(self.log_path, "a") as log:
                log.write(f"--- {self.spec.name} exited with code {code}; actor exits\n")
            os._exit(1)

    # ------------------------------------------------------------------ remote methods

    def address(self) -> str:
        """host:port of the server (the synchronizer's gRPC, a rank's or gateway's HTTP)."""
        return f"{self.ip}:{self.ports[0]}"

    def info(self) -> dict[str, Any]:
        """Role, addresses, child pid (= its process group), node and incarnation."""
        out = {"role": self.spec.role, "name": self.spec.name, "address": self.address(),
               "pid": self.proc.pid, "alive": self.proc.poll() is None,
               "node_id": self.node_id, "incarnation": self.incarnation,
               "log": str(self.log_path)}
        if self.spec.role == "sync":
            out["metrics"] = f"http://{self.ip}:{self.ports[1]}/metrics"
        else:
            out["url"] = f"{'https' if self.tls_files else 'http'}://{self.address()}"
        return out

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the server (through the reaper), SIGKILL its process group after
        `grace_s`; its exit code."""
        self._stopping = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGINT)  # the reaper's "stop gracefully"
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s + 5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            self._state_path().unlink()
        return self.proc.returncode


def raylet_pid() -> list[int]:
    """The pid of this worker's raylet (its nearest ancestor whose command is Ray's `raylet`
    binary), as a list of one; empty when none is found."""
    pid = os.getppid()
    for _ in range(4):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return []
        if os.path.basename(cmd) == b"raylet":
            return [pid]
        if ppid <= 1:
            return []
        pid = ppid
    return []


class SyncActor(RoleActor):
    """The synchronizer's gRPC daemon (named; ranks and gateway find it by name)."""


class RankActor(RoleActor):
    """One data-parallel rank server with its vLLM engine, pinned to its bundle."""


class GatewayActor(RoleActor):
    """The gateway: the trainers' HTTP address and the status page."""


ACTOR_CLASSES: dict[str, type[RoleActor]] = {
    "sync": SyncActor, "rank": RankActor, "gateway": GatewayActor}
