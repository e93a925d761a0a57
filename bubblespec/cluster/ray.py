"""`RayCluster`: the synchronizer, N rank servers and the gateway as Ray actors.

The same `Cluster` interface as `LocalCluster`, so the run driver, the benchmarks and the
tests take either. On `start()`:

1. joins a Ray cluster (`address="auto"`, `"ray://head:10001"`, ...) or starts a local one
   (`address=None`);
2. checks that what it asks can be placed at all (`ray_placement`: the rank bundles under
   their strategy, and the synchronizer's and gateway's CPUs on the driver's node) and fails
   at once, naming what was asked, what each node offers and the fix, when it cannot;
3. starts the named synchronizer actor on the driver's node and waits for its gRPC health
   (before the bundles, so that no bundle takes the CPU the roles need there);
4. reserves one placement group of N x tp bundles, `{"GPU": 1, "CPU": c}` where the cluster
   has GPUs and `{"CPU": c}` otherwise (plus `bundle_resources`), PACK by default (SPREAD
   as an option); a placement or an actor that waits for resources in use is reported
   within `report_after_s`, with the same account of the nodes;
5. starts one rank actor per data-parallel rank, pinned with
   `PlacementGroupSchedulingStrategy` to its first bundle; each finds the synchronizer by
   its actor name;
6. starts the gateway actor on the driver's node with the ranks' addresses and waits until
   it sees every rank ready and registered.

Every actor has `max_restarts`: Ray restarts a dead rank or synchronizer actor, whose server
comes back on the same node and ports and re-registers (`ray_actors.py`). With
`detached=True` the actors outlive the driver (`bubblespec ray up --detach`), and
`ray_status` / `ray_down` find them again by name. With `tls=True` every server runs with
mutual TLS (a throwaway CA made on the driver, or the files of `pki`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import ssl
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from typing_extensions import Self

from bubblespec.cluster import ray_placement as placement
from bubblespec.cluster.base import Cluster, ClusterError
from bubblespec.cluster.ray_actors import ACTOR_CLASSES, RoleSpec
from bubblespec.cluster.ray_placement import cpu_binding, node_slots, plan_bundles
from bubblespec.tls import (
    DEFAULT_HOSTS,
    Pki,
    channel_credentials,
    client_context,
    grpc_channel,
    write_issued_pki,
    write_throwaway_pki,
)

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
LOG = logging.getLogger(__name__)


def grpc_serving(address: str, credentials: Any = None) -> bool:
    """True when the gRPC health service at `address` says SERVING (TLS with `credentials`)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc_channel(address, credentials) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return False
        return r.status == health_pb2.HealthCheckResponse.SERVING


@dataclass
class RayCluster(Cluster):
    """A synchronizer, `ranks` rank servers and a gateway as Ray actors (module docstring)."""

    ranks: int = 2
    model: str | None = None
    rank_args: Sequence[str] = ()
    gateway_args: Sequence[str] = ()
    sync_args: Sequence[str] = ()
    address: str | None = None
    """Ray cluster to join (`auto`, `ray://host:10001`); None starts a local one."""
    num_cpus: int | None = None
    """Logical CPUs of a local Ray (None: Ray's default, the host's cores)."""
    node_ip_address: str | None = None
    """The IP address the driver's Ray node has (Ray's `_node_ip_address`): a local Ray started
    here, and the node this driver attaches to. None: 127.0.0.1 for a local Ray (everything
    stays on this host's loopback, servers bind it too), Ray's own choice when joining."""
    include_dashboard: bool = False
    """Start the Ray dashboard with a local Ray."""
    name: str = "bubblespec"
    """Prefix of the actors' and placement group's names."""
    namespace: str = "bubblespec"
    tp: int = 1
    strategy: str = "PACK"
    gpus: bool | None = None
    """GPU bundles; None: when the Ray cluster has GPUs."""
    cpus_per_bundle: float = 1.0
    bundle_resources: Mapping[str, float] = field(default_factory=dict)
    """Custom Ray resources each rank bundle also reserves, e.g. `{"worker": 1}`: the ranks
    go only to nodes started with them (`ray start --resources`), not to the head."""
    role_cpus: float = 0.5
    """CPUs the synchronizer and gateway actors each reserve."""
    gateway_port: int = 0
    sync_port: int = 0
    sync_metrics_port: int = 0
    rank_port_base: int = 0
    """A rank serves on base + its index among the ranks of its node (`node_slots`);
    0: a free port chosen by the rank's actor."""
    token: str | None = None
    max_restarts: int = 4
    detached: bool = False
    log_dir: str | None = None
    """Per-node directory of logs and actor state [/tmp/bubblespec-ray/<run id>]."""
    start_timeout_s: float = 600.0
    report_after_s: float = 5.0
    """A placement group or actor still waiting for resources after this long is reported
    (`progress`), naming what was asked and what each node offers."""
    wait_for_nodes_s: float = 0.0
    """How long a request that no alive node can hold waits for nodes to join (a cluster with
    an autoscaler) before the start fails; 0: fail at once."""
    progress: Callable[[str], None] | None = None
    """Where such reports go [a warning on this module's logger]."""
    grace_s: float = 10.0
    env: Mapping[str, str] = field(default_factory=dict)
    bind_cores: bool = True
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    tls: bool = False
    """Mutual TLS everywhere: every actor's server gets the CA, certificate and key of `pki`
    (as PEM text, written on its node), requires client certificates from the CA and presents
    its own; without `pki`, a throwaway CA and one certificate for the Ray nodes' IP addresses
    (those alive at start), localhost and 127.0.0.1 are made on the driver at start."""
    pki: Pki | None = None
    """The CA, certificate and key files to use with `tls`; the certificate must name every
    node's IP address (ranks advertise it) and allow both server and client auth."""
    tls_issuer: tuple[str, str] | None = None
    """(CA certificate, CA key) PEM files with `tls` and no `pki`: the certificate made at
    start is signed by this CA instead of a throwaway one (e.g. a Secret on KubeRay, whose CA
    the trainers trust), for the nodes' IPs and `tls_hosts`."""
    tls_hosts: Sequence[str] = ()
    """More names the certificate made at start carries (e.g. the head's Service name)."""
    actors: dict[str, Any] = field(default_factory=dict, init=False)
    info: dict[str, dict[str, Any]] = field(default_factory=dict, init=False)
    _pg: Any = field(default=None, init=False, repr=False)
    _own_ray: bool = field(default=False, init=False, repr=False)
    _pem: tuple[tuple[str, str], ...] = field(default=(), init=False, repr=False)

    # ------------------------------------------------------------------ addresses

    @property
    def gateway_url(self) -> str:
        return str(self.info["gateway"]["url"])

    @property
    def sync_address(self) -> str:
        return str(self.info["sync"]["address"])

    @property
    def rank_ids(self) -> list[str]:
        return [f"r{i}" for i in range(self.ranks)]

    @property
    def rank_urls(self) -> dict[str, str]:
        return {r: str(self.info[r]["url"]) for r in self.rank_ids if r in self.info}

    def addresses(self) -> dict[str, Any]:
        out = {"gateway": self.gateway_url, "synchronizer": self.sync_address,
               "sync_metrics": self.info["sync"]["metrics"], "ranks": self.rank_urls,
               "ray_namespace": self.namespace, "actors": self.actor_names(),
               "log_dir": self.info["sync"]["log"].rsplit("/", 1)[0] + " (on each node)"}
        if self.tls and self.pki is not None:
            out.update(tls_ca=str(self.pki.ca), tls_cert=str(self.pki.cert),
                       tls_key=str(self.pki.key))
        return out

    def client_tls(self) -> dict[str, str]:
        if not self.tls or self.pki is None:
            return {}
        return {"ca": str(self.pki.ca), "cert": str(self.pki.cert), "key": str(self.pki.key)}

    def _verify(self) -> ssl.SSLContext | bool:
        """httpx's `verify=` for the driver's readiness probes."""
        if not self.tls or self.pki is None:
            return True
        return client_context(self.pki.ca, self.pki.cert, self.pki.key)

    def _tls_pem(self) -> tuple[tuple[str, str], ...]:
        """The PEM texts every actor gets (`RoleSpec.tls`); a throwaway CA made here first
        when `tls` is on without `pki`."""
        if not self.tls:
            return ()
        if self.pki is None:
            import ray

            ips = [str(n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive")]
            where = tempfile.mkdtemp(prefix=f"bubblespec-ray-tls-{self.run_id}-")
            hosts = [*DEFAULT_HOSTS, *ips, *self.tls_hosts]
            if self.tls_issuer is not None:
                self.pki = write_issued_pki(where, *self.tls_issuer, hosts=hosts)
            else:
                self.pki = write_throwaway_pki(where, hosts=hosts)
        return (("ca", self.pki.ca.read_text()), ("cert", self.pki.cert.read_text()),
                ("key", self.pki.key.read_text()))

    def actor_names(self) -> dict[str, str]:
        return {n: f"{self.name}-{n}" for n in ["sync", *self.rank_ids, "gateway"]}

    # ------------------------------------------------------------------ start / stop

    def _connect(self) -> None:
        import ray

        if ray.is_initialized():
            return
        kw: dict[str, Any] = {"namespace": self.namespace, "log_to_driver": False}
        ip = self.node_ip_address or ("127.0.0.1" if self.address is None else None)
        if ip:
            kw["_node_ip_address"] = ip
        if self.address is None:  # logical CPUs: enough for every bundle and both roles
            need = math.ceil(self.ranks * self.tp * self.cpus_per_bundle + 2 * self.role_cpus)
            kw.update(num_cpus=self.num_cpus or max(need, os.cpu_count() or 1),
                      include_dashboard=self.include_dashboard,
                      resources={k: v * self.ranks * self.tp
                                 for k, v in self.bundle_resources.items()})
        self._preflight()
        try:
            ray.init(address=self.address, **kw)
        except Exception as e:  # Ray raises a bare Exception, ConnectionError, ...
            where = self.address or "a new local instance"
            raise ClusterError(f"Ray ({where}) did not start or answer: {e}") from e
        self._own_ray = True

    def _preflight(self, timeout_s: float = 5.0) -> None:
        """ClusterError at once when `address` is a GCS host:port that does not accept a TCP
        connection (as Ray will dial it: Ray turns 127.0.0.1 into the host's address unless
        told otherwise); `ray.init` would retry it for many minutes. Ray Client (`ray://`)
        and `auto` addresses are left to Ray."""
        if not self.address or self.address == "auto" or "://" in self.address:
            return
        try:
            from ray._private.services import canonicalize_bootstrap_address

            target = canonicalize_bootstrap_address(self.address) or self.address
        except Exception:  # noqa: BLE001 - a private helper: the address as given
            target = self.address
        host, _, port = target.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except (OSError, ValueError) as e:
            raise ClusterError(f"Ray at {self.address} (dialled as {target}) does not answer: "
                               f"{e}; is the head up, and is the address its GCS port "
                               "(`ray start --head --port`)?") from None

    def _spec(self, role: str, name: str, args: Sequence[str], ports: tuple[int, ...] = (),
              env: Mapping[str, str] | None = None) -> RoleSpec:
        return RoleSpec(role=role, name=name, run_id=self.run_id, args=tuple(args),
                        ports=ports, env={**self.env, **(env or {})},
                        sync_actor="" if role == "sync" else self.actor_names()["sync"],
                        namespace=self.namespace, grace_s=self.grace_s,
                        state_dir=self.log_dir or "", tls=self._pem)

    def _actor(self, name: str, spec: RoleSpec, strategy: Any, **resources: Any) -> Any:
        import ray

        cls = ray.remote(ACTOR_CLASSES[spec.role])
        opts: dict[str, Any] = {"name": self.actor_names()[name], "namespace": self.namespace,
                                "max_restarts": self.max_restarts,
                                "scheduling_strategy": strategy, **resources}
        if self.detached:
            opts["lifetime"] = "detached"
        actor = cls.options(**opts).remote(spec)
        self.actors[name] = actor
        return actor

    def start(self) -> Self:
        """Reserve the bundles, start every actor, wait until all are ready; `ClusterError`
        (everything stopped) if not."""
        if self.tp != 1:
            raise ClusterError("tp > 1: the rank's engine has no tensor-parallel setting yet "
                               "(bundles for it are planned by plan_bundles)")
        if self.strategy not in STRATEGIES:
            raise ClusterError(f"strategy must be one of {STRATEGIES}, not {self.strategy!r}")
        if not self.model and not any(a.startswith("--model") for a in self.rank_args):
            from bubblespec.tasks import default_model_dir

            try:
                self.model = str(default_model_dir())
            except FileNotFoundError as e:
                raise ClusterError(f"no model for the ranks: {e} (or pass --model DIR)") from None
        deadline = time.monotonic() + self.start_timeout_s
        try:
            self._connect()
            self._start_actors(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_actors(self, deadline: float) -> None:
        bundles = self._start_sync_and_reserve(deadline)
        self._start_ranks_and_gateway(bundles, deadline)

    def _here(self) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                              soft=False)

    def _gpus(self) -> bool:
        import ray

        return self.gpus if self.gpus is not None else ray.cluster_resources().get("GPU", 0) > 0

    def _start_sync_and_reserve(self, deadline: float) -> list[dict]:
        """Check the request, start the synchronizer, reserve the rank bundles: the bundles."""
        import ray

        bundles = plan_bundles(self.ranks, self.tp, self._gpus(), self.cpus_per_bundle,
                               self.bundle_resources)
        self._check_feasible(bundles)
        self._pem = self._tls_pem()
        creds = (channel_credentials(self.pki.ca, self.pki.cert, self.pki.key)
                 if self.tls and self.pki is not None else None)
        tok = ["--token", self.token] if self.token else []
        sync_ports = (self.sync_port, self.sync_metrics_port) if self.sync_port else ()
        self._actor("sync", self._spec("sync", "sync", [*tok, *self.sync_args], sync_ports),
                    self._here(), num_cpus=self.role_cpus)
        self._wait(["sync"], deadline,
                   lambda _n: grpc_serving(self.info["sync"]["address"], creds), bundles)
        self._pg = ray.util.placement_group(
            bundles, strategy=self.strategy, name=f"{self.name}-pg",
            lifetime="detached" if self.detached else None)
        self._wait_placed(bundles, deadline)
        return bundles

    def _start_ranks_and_gateway(self, bundles: list[dict], deadline: float) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = "GPU" in bundles[0]  # as the bundles were planned
        model = ["--model", self.model] if self.model else []
        tok = ["--token", self.token, "--sync-token", self.token] if self.token else []
        cores = (os.cpu_count() or 1) if self.address is None else 0  # local Ray: this host
        nodes = ray.util.placement_group_table(self._pg)["bundles_to_node_id"]
        slots = node_slots([nodes[i * self.tp] for i in range(self.ranks)])
        for i, rank in enumerate(self.rank_ids):
            env = cpu_binding(i, self.ranks, cores) if self.bind_cores and not gpus else {}
            ports = (self.rank_port_base + slots[i],) if self.rank_port_base else ()
            strategy = PlacementGroupSchedulingStrategy(self._pg, i * self.tp)
            spec = self._spec("rank", rank, [*model, *tok, *self.rank_args], ports, env)
            self._actor(rank, spec, strategy, num_cpus=self.cpus_per_bundle,
                        num_gpus=1 if gpus else 0, resources=dict(self.bundle_resources))
        self._wait(self.rank_ids, deadline, self._rank_ready, bundles)
        ranks = json.dumps([self.info[r]["address"] for r in self.rank_ids])
        args = ["--ranks", ranks, *(["--tokenizer", self.model] if self.model else [])]
        if self.token:
            args += ["--token", self.token, "--rank-token", self.token, "--sync-token",
                     self.token]
        ports = (self.gateway_port,) if self.gateway_port else ()
        self._actor("gateway", self._spec("gateway", "gateway", [*args, *self.gateway_args],
                                          ports), self._here(), num_cpus=self.role_cpus)
        self._wait(["gateway"], deadline, lambda _n: self._gateway_sees_all(), bundles)

    # ------------------------------------------------------------------ placement

    def nodes(self) -> list[placement.RayNode]:
        """The alive Ray nodes: totals, what is free now, which one is the driver's."""
        import ray

        try:  # Ray's per-node free resources (from the GCS; no dashboard needed)
            from ray._private import state

            free = state.available_resources_per_node()
        except Exception:  # noqa: BLE001 - a private API (not under Ray Client): totals only
            free = {}
        me = ray.get_runtime_context().get_node_id()
        return [placement.RayNode(node_id=n["NodeID"], ip=str(n.get("NodeManagerAddress")),
                                  total=dict(n.get("Resources", {})),
                                  available=dict(free.get(n["NodeID"], {})),
                                  driver=n["NodeID"] == me)
                for n in ray.nodes() if n.get("Alive")]

    def _report(self, text: str) -> None:
        (self.progress or LOG.warning)(text)

    def _check_feasible(self, bundles: list[dict]) -> None:
        """ClusterError at once (or after `wait_for_nodes_s` without a node that would do)
        when no alive node set can ever hold the request."""
        until = time.monotonic() + self.wait_for_nodes_s
        reported = False
        while why := placement.infeasible(bundles, self.strategy, self.nodes(),
                                          self.role_cpus):
            if time.monotonic() >= until:
                raise ClusterError(f"cannot start {self.name}: {why}")
            if not reported:
                self._report(f"waiting up to {self.wait_for_nodes_s:g} s for nodes: {why}")
                reported = True
            time.sleep(1.0)

    def _wait_placed(self, bundles: list[dict], deadline: float) -> None:
        """Until the placement group is placed; reported when it waits past `report_after_s`,
        ClusterError when it has been infeasible (a node left) for `wait_for_nodes_s`, or at
        `deadline`."""
        import ray

        t0, reported, infeasible_since = time.monotonic(), False, None
        while True:
            try:
                ray.get(self._pg.ready(), timeout=1.0)
                return
            except ray.exceptions.GetTimeoutError:
                pass
            now, nodes = time.monotonic(), self.nodes()
            waited = now - t0
            why = placement.infeasible(bundles, self.strategy, nodes, self.role_cpus)
            infeasible_since = (infeasible_since or now) if why else None
            if why and now - infeasible_since >= self.wait_for_nodes_s:
                raise ClusterError(f"cannot start {self.name}: {why}")
            if time.monotonic() > deadline:
                raise ClusterError(f"placement group not placed in {self.start_timeout_s:g} s: "
                                   + placement.pending("it was", waited, bundles,
                                                       self.strategy, nodes, self.role_cpus))
            if not reported and waited >= self.report_after_s:
                self._report(placement.pending("the rank bundles' placement group", waited,
                                               bundles, self.strategy, nodes, self.role_cpus))
                reported = True

    def refresh(self, name: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Ask actor `name` for its addresses and child pid (again after a restart)."""
        import ray

        self.info[name] = ray.get(self.actors[name].info.remote(), timeout=timeout_s)
        return self.info[name]

    def _wait(self, names: list[str], deadline: float, ready: Any,
              bundles: list[dict] | None = None) -> None:
        """Until every actor of `names` answers and is `ready`; an actor not yet scheduled
        after `report_after_s` is reported with the nodes' resources."""
        import ray

        pending, t0, reported = list(names), time.monotonic(), False
        while pending:
            started = []
            for n in pending:
                try:
                    self.refresh(n, timeout_s=5.0)
                    started.append(n)
                except ray.exceptions.RayActorError as e:
                    raise ClusterError(f"{n}: actor died during start: {e}") from None
                except ray.exceptions.GetTimeoutError:
                    pass  # not scheduled or still starting its worker
            unscheduled = [n for n in pending if n not in started and n not in self.info]
            pending = [n for n in pending if n not in started or not ready(n)]
            if not pending:
                return
            waited = time.monotonic() - t0
            if unscheduled and not reported and waited >= self.report_after_s:
                self._report(placement.pending(
                    f"actor(s) {', '.join(unscheduled)}", waited, bundles or [],
                    self.strategy, self.nodes(), self.role_cpus))
                reported = True
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n} ({self.info[n]['log']}):\n{self.log_tail(n, 15)}"
                                  if n in self.info else f"--- {n}: actor not started\n"
                                  + placement.describe_nodes(self.nodes()) for n in pending)
                raise ClusterError(f"not ready after {self.start_timeout_s:g} s: "
                                   f"{', '.join(pending)}\n{tails}")
            time.sleep(0.25)

    def log_tail(self, name: str, lines: int = 40) -> str:
        import ray

        try:
            return str(ray.get(self.actors[name].log_tail.remote(lines), timeout=10))
        except ray.exceptions.RayError as e:
            return f"(no log: {e})"

    def _rank_ready(self, name: str) -> bool:
        """Ready once /health_generate says 200; ClusterError when the engine failed."""
        try:
            r = httpx.get(self.info[name]["url"] + "/health_generate", timeout=2.0,
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
            raise ClusterError(f"{name}: {detail}; last lines:\n{self.log_tail(name)}")
        return False

    def _gateway_sees_all(self) -> bool:
        try:
            verify = self._verify()
            if httpx.get(self.gateway_url + "/health_generate", timeout=2.0,
                         verify=verify).status_code != 200:
                return False
            r = httpx.get(self.gateway_url + "/v1/ranks", timeout=5.0, verify=verify).json()
        except (httpx.HTTPError, ValueError):
            return False
        ready = {x["rank_id"] for x in r.get("ranks", []) if x.get("ready")
                 and x.get("registered")}
        return ready >= set(self.rank_ids) if r.get("sync_ok") else False

    def stop(self) -> None:
        """Stop every server (gateway, ranks, synchronizer), kill the actors, free the
        bundles, and shut down a Ray this cluster started. Safe to call twice."""
        import ray

        if not ray.is_initialized():
            return
        names = [n for n in ["gateway", *self.rank_ids, "sync"] if n in self.actors]
        _stop_actors([self.actors[n] for n in names], self.grace_s)
        self.actors.clear()
        if self._pg is not None:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
        if self._own_ray:
            ray.shutdown()
            self._own_ray = False


def _stop_actors(actors: list[Any], grace_s: float) -> None:
    """Ask each actor to stop its server gracefully (all at once), then kill the actors."""
    import ray

    refs = [a.stop.remote(grace_s) for a in actors]
    for ref in refs:
        try:
            ray.get(ref, timeout=grace_s + 10)
        except ray.exceptions.RayError:
            pass
    for a in actors:
        ray.kill(a, no_restart=True)


def ray_status(name: str = "bubblespec", namespace: str = "bubblespec") -> dict[str, Any]:
    """{actor name: its info() or the error asking it} for a cluster's named actors."""
    import ray

    out: dict[str, Any] = {}
    for actor_name in sorted(ray.util.list_named_actors()):
        if not actor_name.startswith(f"{name}-"):
            continue
        try:
            actor = ray.get_actor(actor_name, namespace=namespace)
            out[actor_name] = ray.get(actor.info.remote(), timeout=10)
        except ray.exceptions.RayError as e:
            out[actor_name] = {"error": str(e).splitlines()[0]}
    return out


def ray_down(name: str = "bubblespec", namespace: str = "bubblespec",
             grace_s: float = 10.0) -> list[str]:
    """Stop a (detached) cluster's actors and free its placement group; the names stopped."""
    import ray

    names = sorted(n for n in ray.util.list_named_actors() if n.startswith(f"{name}-"))
    order = sorted(names, key=lambda n: (n.endswith("-sync"), not n.endswith("-gateway")))
    _stop_actors([ray.get_actor(n, namespace=namespace) for n in order], grace_s)
    try:
        ray.util.remove_placement_group(ray.util.get_placement_group(f"{name}-pg"))
    except ValueError:
        pass
    return order
