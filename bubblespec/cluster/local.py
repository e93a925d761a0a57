"""`LocalCluster`: a synchronizer, N rank servers and a gateway as child processes on one host.

Picks free loopback ports, starts the synchronizer, then the ranks and the gateway, and
waits until all are ready (gRPC health for the synchronizer, `/health_generate` for ranks
and gateway, and the gateway seeing every rank). A child that dies during start stops the
rest and raises `ClusterError` with that child's log tail. Once started, the cluster
supervises its children (`supervise`, on by default; `cluster/supervisor.py`): one that
exits, whatever its status, is started again with the same command after a backoff, until
it dies faster than the give-up rate (`gave_up` then names it). `stop()` ends supervision
first, then sends SIGTERM to every child, then SIGKILL to whatever is left after a grace
period. Each child logs to `<log-dir>/<name>.log`. Used by `bubblespec up`, `bubblespec run`,
the benchmarks and the tests. `tls=True` makes a throwaway CA and runs every child with mutual
TLS (clients then pass `client_tls()`):

    with LocalCluster(ranks=2) as c:
        BubbleSpecClient(c.gateway_url).rollout(...)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from typing_extensions import Self

from bubblespec.cluster.base import Cluster, ClusterError
from bubblespec.cluster.child import Child
from bubblespec.cluster.supervisor import ChildEvent, Supervisor
from bubblespec.tls import (
    DEFAULT_HOSTS,
    Pki,
    channel_credentials,
    client_context,
    grpc_channel,
    write_throwaway_pki,
)

CHILD_ENV = {"PYTHONUNBUFFERED": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
             "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "MALLOC_ARENA_MAX": "2"}
"""Defaults for children's environment (the caller's environment wins). MALLOC_ARENA_MAX=2
caps glibc's per-thread malloc arenas: vLLM's worker runs many threads, and with the default
(8 per core) its RSS crept up over long runs in the soak benchmark (fragmentation)."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free TCP ports on `host` (held open together while choosing)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class LocalCluster(Cluster):
    """A synchronizer, `ranks` rank servers and a gateway on loopback, as child processes."""

    ranks: int = 2
    model: str | None = None
    rank_args: Sequence[str] = ()
    gateway_args: Sequence[str] = ()
    sync_args: Sequence[str] = ()
    log_dir: str | Path | None = None
    host: str = "127.0.0.1"
    gateway_port: int = 0
    sync_port: int = 0
    token: str | None = None
    start_timeout_s: float = 600.0
    grace_s: float = 10.0
    env: Mapping[str, str] = field(default_factory=dict)
    bind_cores: bool = True
    """Pin rank i's engine threads to its own cores when there are enough (else vLLM's auto)."""
    python: str = sys.executable
    supervise: bool = True
    """Once started, start a child that exited again (after a backoff); False: leave it dead
    (for tests of what a dead child does to the rest)."""
    restart_backoff_s: float = 1.0
    """First delay before a dead child is started again; doubled after each death."""
    restart_backoff_max_s: float = 30.0
    """Longest delay before a dead child is started again."""
    restart_stable_s: float = 60.0
    """A child that stayed up this long before dying is restarted after the first delay."""
    give_up_restarts: int = 10
    """Give up on a child that dies again after this many restarts within give_up_window_s."""
    give_up_window_s: float = 600.0
    """The window of give_up_restarts, seconds."""
    on_child_event: Callable[[ChildEvent], None] | None = None
    """Called (from the supervisor's thread) on every exit, restart and give-up of a child."""
    tls: bool = False
    """Mutual TLS everywhere: a throwaway CA and one certificate for this host, made in
    `<log-dir>/tls/` at start (`bubblespec.tls.write_throwaway_pki`); every child serves TLS,
    requires a client certificate from that CA and presents its own. Clients pass
    `client_tls()` (the CA, and a certificate signed by it)."""
    pki: Pki | None = field(default=None, init=False)
    """The CA and certificate files when `tls` (set at start)."""
    children: dict[str, Child] = field(default_factory=dict, init=False)
    supervisor: Supervisor | None = field(default=None, init=False, repr=False)
    _rank_ports: list[int] = field(default_factory=list, init=False, repr=False)
    _sync_metrics_port: int = field(default=0, init=False, repr=False)

    # ------------------------------------------------------------------ addresses

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def gateway_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.gateway_port}"

    @property
    def sync_address(self) -> str:
        return f"{self.host}:{self.sync_port}"

    @property
    def rank_ids(self) -> list[str]:
        return [f"r{i}" for i in range(self.ranks)]

    @property
    def rank_urls(self) -> dict[str, str]:
        return {r: f"{self.scheme}://{self.host}:{p}"
                for r, p in zip(self.rank_ids, self._rank_ports)}

    def addresses(self) -> dict[str, Any]:
        out = {"gateway": self.gateway_url, "synchronizer": self.sync_address,
               "sync_metrics": f"http://{self.host}:{self._sync_metrics_port}/metrics",
               "ranks": self.rank_urls, "log_dir": str(self.log_dir)}
        if self.pki is not None:
            out.update(tls_ca=str(self.pki.ca), tls_cert=str(self.pki.cert),
                       tls_key=str(self.pki.key))
        return out

    def client_tls(self) -> dict[str, str]:
        if self.pki is None:
            return {}
        return {"ca": str(self.pki.ca), "cert": str(self.pki.cert), "key": str(self.pki.key)}

    def _verify(self) -> ssl.SSLContext | bool:
        """httpx's `verify=` for the cluster's own readiness probes."""
        if self.pki is None:
            return True
        return client_context(self.pki.ca, self.pki.cert, self.pki.key)

    # ------------------------------------------------------------------ start / stop

    def _cmd(self, *args: str) -> list[str]:
        return [self.python, "-m", "bubblespec.cli.main", *args]

    def _child_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {**CHILD_ENV, **os.environ, **self.env, **(extra or {})}
        root = str(Path(__file__).resolve().parents[2])  # a checkout without `pip install -e`
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        return env

    def _plan(self) -> None:
        ports = free_ports(3 + self.ranks, self.host)
        self.sync_port = self.sync_port or ports[0]
        self.gateway_port = self.gateway_port or ports[1]
        self._sync_metrics_port = ports[2]
        self._rank_ports = ports[3:]
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="bubblespec-up-")
        log_dir = Path(self.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        tls: list[str] = []
        if self.tls:
            if self.pki is None:
                self.pki = write_throwaway_pki(
                    log_dir / "tls", hosts=list(dict.fromkeys([*DEFAULT_HOSTS, self.host])))
            tls = self.pki.flags(client_auth=True)
        tok = ["--token", self.token] if self.token else []
        # the synchronizer journals its state, so a restart of it (by the supervisor, or a
        # drill's restart()) comes back with the step and the drafts; a new cluster starts
        # from an empty journal
        journal = log_dir / "sync.journal"
        journal.unlink(missing_ok=True)
        self.children["sync"] = Child("sync", self._cmd(
            "sync", "--host", self.host, "--port", str(self.sync_port), "--metrics-host",
            self.host, "--metrics-port", str(self._sync_metrics_port), "--journal-path",
            str(journal), *tok, *tls, *self.sync_args), log_dir / "sync.log",
            self._child_env())
        cores = os.cpu_count() or 1
        per = cores // self.ranks if self.ranks else 0
        for i, (rank_id, port) in enumerate(zip(self.rank_ids, self._rank_ports)):
            extra = {}
            if self.bind_cores and per >= 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                lo, hi = i * per, (i + 1) * per - 1
                extra["VLLM_CPU_OMP_THREADS_BIND"] = f"{lo}-{hi}" if hi > lo else str(lo)
            argv = ["rank", "--rank-id", rank_id, "--host", self.host, "--port", str(port),
                    "--sync-address", self.sync_address]
            if self.model:
                argv += ["--model", str(self.model)]
            if self.token:
                argv += ["--token", self.token, "--sync-token", self.token]
            argv += tls
            self.children[rank_id] = Child(rank_id, self._cmd(*argv, *self.rank_args),
                                           log_dir / f"{rank_id}.log", self._child_env(extra))
        argv = ["gateway", "--host", self.host, "--port", str(self.gateway_port),
                "--sync-address", self.sync_address, "--ranks",
                json.dumps([f"{self.host}:{p}" for p in self._rank_ports])]
        if self.model:
            argv += ["--tokenizer", str(self.model)]
        if self.token:
            argv += ["--token", self.token, "--rank-token", self.token, "--sync-token",
                     self.token]
        argv += tls
        self.children["gateway"] = Child("gateway", self._cmd(*argv, *self.gateway_args),
                                         log_dir / "gateway.log", self._child_env())

    def start(self) -> Self:
        """Start every child and wait until all are ready; ClusterError (all stopped) if not."""
        if not self.model and not any(a.startswith("--model") for a in self.rank_args):
            from bubblespec.tasks import default_model_dir

            try:
                default_model_dir()
            except FileNotFoundError as e:
                raise ClusterError(f"no model for the ranks: {e} (or pass --model DIR)") from None
        self._plan()
        deadline = time.monotonic() + self.start_timeout_s
        try:
            self.children["sync"].start()
            self._wait(["sync"], deadline, lambda _n: self._sync_ready())
            for name in [*self.rank_ids, "gateway"]:
                self.children[name].start()
            self._wait(self.rank_ids, deadline, self._rank_ready)
            self._wait(["gateway"], deadline, lambda _n: self._gateway_sees_all())
        except BaseException:
            self.stop()
            raise
        if self.supervise:
            self.supervisor = Supervisor(
                self.children, backoff_s=self.restart_backoff_s,
                backoff_max_s=self.restart_backoff_max_s, stable_s=self.restart_stable_s,
                give_up_restarts=self.give_up_restarts, give_up_window_s=self.give_up_window_s,
                on_event=self.on_child_event).start()
        return self

    @property
    def gave_up(self) -> dict[str, ChildEvent]:
        """Children the supervisor gave up on (they died too often), with their last death."""
        return dict(self.supervisor.gave_up) if self.supervisor is not None else {}

    def restarts(self, name: str) -> int:
        """How many times the supervisor started `name` again."""
        return self.supervisor.restarts(name) if self.supervisor is not None else 0

    def _wait(self, names: list[str], deadline: float, ready: Any,
              watch: Sequence[str] | None = None) -> None:
        """Wait until `ready(name)` for each of `names`; ClusterError when one of `watch`
        (default: every child) died or the deadline passed."""
        pending = list(names)
        watched = list(self.children) if watch is None else list(watch)
        while pending:
            for name in watched:
                child = self.children[name]
                if child.proc is not None and not child.alive:
                    raise ClusterError(
                        f"{name} exited with code {child.proc.returncode} during start "
                        f"(log {child.log_path}); last lines:\n{child.log_tail()}")
            pending = [n for n in pending if not ready(n)]
            if not pending:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n} ({self.children[n].log_path}):\n"
                                  f"{self.children[n].log_tail(15)}" for n in pending)
                raise ClusterError(f"not ready after {self.start_timeout_s:g} s: "
                                   f"{', '.join(pending)}\n{tails}")
            time.sleep(0.25)

    def _sync_ready(self) -> bool:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        creds = (None if self.pki is None
                 else channel_credentials(self.pki.ca, self.pki.cert, self.pki.key))
        with grpc_channel(self.sync_address, creds) as ch:
            try:
                r = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=1.0)
            except grpc.RpcError:
                return False
            return r.status == health_pb2.HealthCheckResponse.SERVING

    def _rank_ready(self, name: str) -> bool:
        """Ready once /health_generate says 200; ClusterError when the engine failed to start
        (the rank stays up and reports why, which would otherwise wait out the timeout)."""
        try:
            r = httpx.get(self.rank_urls[name] + "/health_generate", timeout=2.0,
                          verify=self._verify())
        except httpx.HTTPError:
            return False
        if r.status_code == 200:
            return True
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = None
        if isinstance(detail, str) and "fail" in detail:
            child = self.children[name]
            raise ClusterError(f"{name}: {detail} (log {child.log_path}); last lines:\n"
                               f"{child.log_tail()}")
        return False

    def _http_ready(self, url: str) -> bool:
        try:
            return httpx.get(url, timeout=2.0, verify=self._verify()).status_code == 200
        except httpx.HTTPError:
            return False

    def _gateway_sees_all(self) -> bool:
        if not self._http_ready(self.gateway_url + "/health_generate"):
            return False
        try:
            r = httpx.get(self.gateway_url + "/v1/ranks", timeout=5.0,
                          verify=self._verify()).json()
        except (httpx.HTTPError, ValueError):
            return False
        ready = {x["rank_id"] for x in r.get("ranks", []) if x.get("ready")
                 and x.get("registered")}
        return ready >= set(self.rank_ids) if r.get("sync_ok") else False

    def stop(self) -> None:
        """End supervision (its thread has ended when this returns, so nothing restarts during
        shutdown); SIGTERM every child (gateway, ranks, synchronizer), SIGKILL after the grace
        period; then SIGKILL each child's process group (engine processes a rank left
        behind)."""
        if self.supervisor is not None:
            self.supervisor.stop()
        order = [c for n in ["gateway", *self.rank_ids, "sync"]
                 if (c := self.children.get(n)) is not None]
        for child in order:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for child in order:
            if child.proc is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for child in order:
            child.signal(signal.SIGKILL, group=True)
            if child.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=5)

    # ------------------------------------------------------------------ faults (tests)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to a child's whole process group (simulates a crash). The supervisor
        leaves the child dead until `restart(name)`: a drill decides when it comes back."""
        if self.supervisor is not None:
            self.supervisor.hold(name)
        self.children[name].signal(sig, group=True)
        proc = self.children[name].proc
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def restart(self, name: str, timeout_s: float = 120.0) -> None:
        """Start a dead child again with the same command and wait until it is ready; the
        supervisor (which leaves the child alone meanwhile) watches it again once it is."""
        child = self.children[name]
        sup = self.supervisor
        with sup.lock if sup is not None else contextlib.nullcontext():
            if child.alive:
                raise ClusterError(f"{name} is still running")
            if sup is not None:
                sup.hold(name)  # a restart the supervisor had scheduled is cancelled
            child.start()
        deadline = time.monotonic() + timeout_s
        if name == "sync":
            self._wait([name], deadline, lambda _n: self._sync_ready(), watch=[name])
        elif name == "gateway":
            self._wait([name], deadline,
                       lambda _n: self._http_ready(self.gateway_url + "/health_generate"),
                       watch=[name])
        else:
            self._wait([name], deadline, self._rank_ready, watch=[name])
        if sup is not None:
            sup.release(name)
