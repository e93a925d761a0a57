"""What a `RayCluster` asks of Ray, whether it can be placed, and what to say when it cannot.

The plan: the rank bundles (`plan_bundles`), each rank's port slot on its node
(`node_slots`) and its cores on a local Ray (`cpu_binding`).

Pure functions over what Ray reports of its nodes (`RayNode`: totals and what is free now),
so that `RayCluster.start` can tell at once, before any actor waits, that a request can never
be placed (fail fast, naming what was asked, what each node offers and the fix), and can say
within seconds what a request that waits for resources is waiting for.

What is placed: the rank bundles (one placement group, `strategy`) and the synchronizer and
gateway actors, `role_cpus` each on the driver's node (hard node affinity). The roles are
started before the bundles are reserved, so that a bundle never takes the CPU they need.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

ROLES_ON_DRIVER = 2
"""The synchronizer's and the gateway's actors, both on the driver's node."""


@dataclass(frozen=True)
class RayNode:
    """One alive Ray node as placement sees it."""

    node_id: str
    ip: str
    total: Mapping[str, float]
    available: Mapping[str, float] = field(default_factory=dict)
    driver: bool = False
    """The node the driver runs on (where the synchronizer and gateway go)."""


def plan_bundles(ranks: int, tp: int, gpus: bool, cpus_per_bundle: float,
                 extra: Mapping[str, float] | None = None) -> list[dict]:
    """The placement group's bundles: `ranks * tp`, one GPU each where there are GPUs, and
    the custom resources of `extra` (which nodes may hold ranks). Rank i owns bundles
    i*tp .. i*tp+tp-1 and its actor sits on the first of them."""
    if ranks < 1 or tp < 1:
        raise ValueError("ranks and tp must be >= 1")
    clash = {"CPU", "GPU", "memory"} & set(extra or {})
    if clash:
        raise ValueError(f"bundle resources name custom resources, not {sorted(clash)}")
    if any(v <= 0 for v in (extra or {}).values()):
        raise ValueError("bundle resource amounts must be > 0")
    bundle: dict[str, float] = {"CPU": cpus_per_bundle}
    if gpus:
        bundle["GPU"] = 1
    bundle.update(extra or {})
    return [dict(bundle) for _ in range(ranks * tp)]


def node_slots(nodes: Sequence[str]) -> list[int]:
    """Each rank's index among the ranks on its node (rank i serves on base + slot): with
    one rank per node (a 1-GPU pod) every rank serves on the same port, which one scrape
    target per pod can name."""
    seen: dict[str, int] = {}
    out = []
    for node in nodes:
        out.append(seen.get(node, 0))
        seen[node] = out[-1] + 1
    return out


def cpu_binding(index: int, ranks: int, cores: int) -> dict[str, str]:
    """Rank `index`'s own cores when each rank gets at least one (what `LocalCluster` does)."""
    per = cores // ranks if ranks else 0
    if per < 1:
        return {}
    lo, hi = index * per, (index + 1) * per - 1
    return {"VLLM_CPU_OMP_THREADS_BIND": f"{lo}-{hi}" if hi > lo else str(lo)}


def _user_resources(res: Mapping[str, float]) -> dict[str, float]:
    """Resources a user names: not Ray's per-node and per-group bookkeeping entries."""
    return {k: v for k, v in res.items()
            if not k.startswith("node:") and "_group_" not in k
            and k not in ("object_store_memory", "memory")}


def fits(need: Mapping[str, float], have: Mapping[str, float]) -> int:
    """How many copies of `need` fit into `have` (0 if one does not)."""
    counts = [math.floor(have.get(k, 0.0) / v + 1e-9) for k, v in need.items() if v > 0]
    return min(counts) if counts else 1_000_000


def _capacity(node: RayNode, role_cpus: float, free: bool) -> dict[str, float]:
    """What a node can give the rank bundles: its totals (or what is free now), less the
    roles' CPUs on the driver's node when counting totals (the roles are placed first)."""
    res = dict(node.available if free else node.total)
    if node.driver and not free:
        res["CPU"] = res.get("CPU", 0.0) - ROLES_ON_DRIVER * role_cpus
    return res


def bundles_fit(bundles: Sequence[Mapping[str, float]], strategy: str,
                nodes: Sequence[RayNode], role_cpus: float = 0.0, free: bool = False) -> bool:
    """Whether the (identical) rank bundles can be placed on `nodes` under `strategy`:
    on the nodes' totals (can it ever be placed?) or on what is free now (`free`)."""
    if not bundles:
        return True
    one, n = bundles[0], len(bundles)
    caps = [_capacity(node, role_cpus, free) for node in nodes]
    if strategy == "STRICT_PACK":
        return any(fits(one, cap) >= n for cap in caps)
    if strategy == "STRICT_SPREAD":
        return sum(1 for cap in caps if fits(one, cap) >= 1) >= n
    return sum(fits(one, cap) for cap in caps) >= n  # PACK, SPREAD: soft, anywhere


def roles_fit(nodes: Sequence[RayNode], role_cpus: float, free: bool = False,
              roles: int = ROLES_ON_DRIVER) -> bool:
    """Whether `roles` role actors of `role_cpus` fit on the driver's node."""
    driver = next((n for n in nodes if n.driver), None)
    if driver is None:
        return False
    have = (driver.available if free else driver.total).get("CPU", 0.0)
    return have + 1e-9 >= roles * role_cpus


def _fmt(res: Mapping[str, float]) -> str:
    items = sorted(_user_resources(res).items())
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in items) + "}"


def describe_nodes(nodes: Sequence[RayNode]) -> str:
    """Each node's user resources, free / total, the driver's marked."""
    lines = []
    for n in nodes:
        tot = _user_resources(n.total)
        free = {k: n.available.get(k, 0.0) for k in tot}
        where = " (driver: synchronizer, gateway)" if n.driver else ""
        lines.append(f"  node {n.ip} {n.node_id[:8]}{where}: free {_fmt(free)} "
                     f"of {_fmt(tot)}")
    return "\n".join(lines) if lines else "  (no alive node)"


FIX = ("to fix: give the ranks nodes of their own (`--bundle-resource NAME=1`, with the "
       "worker nodes started with `ray start --resources '{\"NAME\": 1}'`), ask for fewer "
       "CPUs per bundle (`--cpus-per-bundle`) or per role (`--role-cpus`), choose a softer "
       "strategy (PACK or SPREAD), or add nodes")


def asked(bundles: Sequence[Mapping[str, float]], strategy: str, role_cpus: float) -> str:
    """What the cluster asks of Ray, in one line."""
    one = _fmt(bundles[0]) if bundles else "{}"
    return (f"{len(bundles)} rank bundle(s) of {one} ({strategy}), and "
            f"{ROLES_ON_DRIVER} x {{CPU: {role_cpus:g}}} on the driver's node for the "
            "synchronizer and the gateway")


def infeasible(bundles: Sequence[Mapping[str, float]], strategy: str,
               nodes: Sequence[RayNode], role_cpus: float) -> str:
    """Why the request can never be placed on these nodes; empty when it can."""
    if not roles_fit(nodes, role_cpus):
        why = "the driver's node cannot hold the synchronizer and the gateway"
    elif not bundles_fit(bundles, strategy, nodes, role_cpus):
        why = "the rank bundles cannot be placed on the nodes there are"
    else:
        return ""
    return (f"infeasible: {why}.\nasked: {asked(bundles, strategy, role_cpus)}\n"
            f"the cluster offers:\n{describe_nodes(nodes)}\n{FIX}")


def pending(what: str, waited_s: float, bundles: Sequence[Mapping[str, float]],
            strategy: str, nodes: Sequence[RayNode], role_cpus: float) -> str:
    """The message for a request that can be placed but waits for resources in use."""
    return (f"{what} pending for {waited_s:.0f} s: the resources exist but are in use.\n"
            f"asked: {asked(bundles, strategy, role_cpus)}\n"
            f"the cluster offers:\n{describe_nodes(nodes)}\n"
            "waiting until the start deadline; " + FIX)
