"""`bubblespec ray up|status|down`: a bubblespec cluster as Ray actors.

    bubblespec ray up [--address auto|ray://HEAD:10001] [--ranks 2] [--detach] ...
    bubblespec ray status [--address auto]
    bubblespec ray down [--address auto]

`up` starts a `RayCluster` (bubblespec/cluster/ray.py): on the Ray cluster at `--address`,
or on a new local Ray instance when none is given. It prints the addresses once every actor
is ready, then runs until Ctrl-C or SIGTERM and stops the actors; with `--detach` (needs
`--address`) it leaves them running and returns, and `status` / `down` find them by name.
`--tls` runs every server with mutual TLS: with the `--tls-ca/--tls-cert/--tls-key` files,
else with a certificate made at start for the nodes' IP addresses (and `--tls-host` names),
signed by `--tls-ca/--tls-ca-key` (a mounted Secret on KubeRay) or by a throwaway CA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bubblespec.cli.signals import stop_on_sigterm
from bubblespec.cluster import ClusterError
from bubblespec.tls import Pki


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="Ray cluster to join: auto, HOST:6379 or ray://HOST:10001 "
                        "[up: start a local Ray]")
    p.add_argument("--name", default="bubblespec", help="prefix of the actor names")
    p.add_argument("--namespace", default="bubblespec", help="Ray namespace of the actors")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bubblespec ray", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start the actors and print the gateway address")
    _common(up)
    up.add_argument("--ranks", type=int, default=2, help="data-parallel ranks [2]")
    up.add_argument("--model", default=None, help="HF model directory on every node "
                                                  "[embedded tiny model]")
    up.add_argument("--strategy", default="PACK",
                    choices=["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"],
                    help="placement group strategy of the rank bundles [PACK]")
    up.add_argument("--cpus-per-bundle", type=float, default=1.0,
                    help="CPUs in each rank bundle [1]")
    up.add_argument("--bundle-resource", action="append", default=[], metavar="NAME=AMOUNT",
                    help="a custom Ray resource every rank bundle also reserves (repeatable), "
                         "e.g. worker=1: ranks only on the nodes started with it")
    up.add_argument("--gpus", action=argparse.BooleanOptionalAction, default=None,
                    help="GPU bundles [when the Ray cluster has GPUs]")
    up.add_argument("--num-cpus", type=int, default=None,
                    help="logical CPUs of a local Ray (no --address) [enough for every bundle "
                         "and the synchronizer and gateway, at least the host's cores]")
    up.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=True,
                    help="start the Ray dashboard with a local Ray [on]")
    up.add_argument("--rank-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for every rank, e.g. --rank-arg=--spec-mode=none")
    up.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for the gateway")
    up.add_argument("--sync-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for the synchronizer")
    up.add_argument("--gateway-port", type=int, default=8000, help="gateway port [8000]")
    up.add_argument("--sync-port", type=int, default=50051, help="synchronizer port [50051]")
    up.add_argument("--sync-metrics-port", type=int, default=9464,
                    help="synchronizer /metrics port [9464]")
    up.add_argument("--rank-port-base", type=int, default=8100,
                    help="a rank serves on BASE + its index among the ranks of its node; "
                         "0: free ports [8100]")
    up.add_argument("--token", default=None, help="bearer token for every service")
    up.add_argument("--max-restarts", type=int, default=4,
                    help="Ray restarts of a dead actor (-1: without limit) [4]")
    up.add_argument("--detach", action="store_true",
                    help="leave the actors running and return (needs --address)")
    up.add_argument("--log-dir", default=None,
                    help="logs and actor state on each node [/tmp/bubblespec-ray/<run id>]")
    up.add_argument("--role-cpus", type=float, default=0.5,
                    help="CPUs the synchronizer's and the gateway's actors each reserve on "
                         "this (the driver's) node [0.5]")
    up.add_argument("--node-ip-address", default=None,
                    help="this node's Ray address (Ray's --node-ip-address) [local Ray: "
                         "127.0.0.1; joining: Ray's choice]")
    up.add_argument("--wait-for-nodes-s", type=float, default=0.0,
                    help="how long a request no alive node can hold waits for nodes to "
                         "join (an autoscaling cluster) before failing [0: fail at once]")
    up.add_argument("--start-timeout-s", type=float, default=600.0,
                    help="give up if not ready after this long [600]; a placement that "
                         "waits for resources in use is reported within seconds")
    up.add_argument("--grace-s", type=float, default=10.0,
                    help="SIGTERM -> SIGKILL grace period at shutdown [10]")
    up.add_argument("--tls", action="store_true",
                    help="mutual TLS between every service and towards clients: with the "
                         "--tls-ca/--tls-cert/--tls-key files, else a throwaway CA for the "
                         "nodes' IPs (its paths are printed)")
    up.add_argument("--tls-ca", default=None, metavar="PEM", help="CA of --tls")
    up.add_argument("--tls-cert", default=None, metavar="PEM",
                    help="certificate of every server with --tls (names every node's IP)")
    up.add_argument("--tls-key", default=None, metavar="PEM", help="key of --tls-cert")
    up.add_argument("--tls-ca-key", default=None, metavar="PEM",
                    help="with --tls-ca instead of --tls-cert/--tls-key: sign the certificate "
                         "made at start for the nodes' IPs with this CA")
    up.add_argument("--tls-host", action="append", default=[], metavar="NAME",
                    help="another name for the certificate made at start (repeatable), e.g. "
                         "the head's Service")
    _common(sub.add_parser("status", help="list the actors and their addresses"))
    down = sub.add_parser("down", help="stop the actors and free their bundles")
    _common(down)
    down.add_argument("--grace-s", type=float, default=10.0, help="grace period [10]")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(list(argv))
    if args.action == "up":
        if args.ranks < 1:
            p.error("--ranks must be >= 1")
        if not args.role_cpus > 0 or args.wait_for_nodes_s < 0:
            p.error("--role-cpus must be > 0 and --wait-for-nodes-s >= 0")
        if args.detach and args.address is None:
            p.error("--detach needs --address (a local Ray ends with this command)")
        files = (args.tls_ca, args.tls_cert, args.tls_key)
        issuer = (args.tls_ca, args.tls_ca_key)
        if args.tls_ca_key:
            if not (all(issuer) and args.tls) or args.tls_cert or args.tls_key:
                p.error("--tls-ca-key goes with --tls and --tls-ca, without --tls-cert/--tls-key")
        elif any(files) and not (all(files) and args.tls):
            p.error("--tls-ca, --tls-cert and --tls-key go together, with --tls")
        if args.tls_host and not args.tls:
            p.error("--tls-host needs --tls")
        args.bundle_resources = {}
        for item in args.bundle_resource:
            name, _, amount = (x.strip() for x in item.partition("="))
            try:
                value = float(amount)
            except ValueError:
                value = 0.0
            if not name or name in ("CPU", "GPU", "memory") or not value > 0:
                p.error(f"--bundle-resource {item!r}: NAME=AMOUNT, a custom resource and an "
                        "amount > 0, e.g. worker=1")
            args.bundle_resources[name] = value
    return args


def down_command(args: argparse.Namespace) -> str:
    """The `bubblespec ray down` that finds the actors `up` started (their name and namespace
    where not the defaults)."""
    cmd = f"bubblespec ray down --address {args.address}"
    if args.name != "bubblespec":
        cmd += f" --name {args.name}"
    if args.namespace != "bubblespec":
        cmd += f" --namespace {args.namespace}"
    return cmd


def _pki(args: argparse.Namespace) -> Pki | None:
    if not args.tls_cert:
        return None
    return Pki(ca=Path(args.tls_ca), cert=Path(args.tls_cert), key=Path(args.tls_key))


def _up(args: argparse.Namespace) -> int:
    from bubblespec.cluster.ray import RayCluster

    cluster = RayCluster(
        ranks=args.ranks, model=args.model, rank_args=args.rank_arg,
        gateway_args=args.gateway_arg, sync_args=args.sync_arg, address=args.address,
        num_cpus=args.num_cpus, include_dashboard=args.dashboard, name=args.name,
        namespace=args.namespace, strategy=args.strategy, gpus=args.gpus,
        cpus_per_bundle=args.cpus_per_bundle, bundle_resources=args.bundle_resources,
        gateway_port=args.gateway_port,
        sync_port=args.sync_port, sync_metrics_port=args.sync_metrics_port,
        rank_port_base=args.rank_port_base, token=args.token, max_restarts=args.max_restarts,
        detached=args.detach, log_dir=args.log_dir, start_timeout_s=args.start_timeout_s,
        grace_s=args.grace_s, tls=args.tls, pki=_pki(args),
        tls_issuer=(args.tls_ca, args.tls_ca_key) if args.tls_ca_key else None,
        tls_hosts=args.tls_host, role_cpus=args.role_cpus,
        node_ip_address=args.node_ip_address, wait_for_nodes_s=args.wait_for_nodes_s,
        progress=lambda text: print(f"bubblespec ray up: {text}", file=sys.stderr, flush=True))
    stop_on_sigterm()
    where = args.address or "a new local Ray instance"
    try:
        print(f"bubblespec ray up: starting {args.ranks} rank(s) on {where}", flush=True)
        cluster.start()
        stop_on_sigterm()  # ray.init installed its own
        print("bubblespec ray up: ready")
        for k, v in cluster.addresses().items():
            print(f"  {k:<13} {v}")
        if cluster.tls and cluster.pki is not None:
            p = cluster.pki
            print(f"TLS: clients verify the servers with ca= {p.ca} and present cert= "
                  f"{p.cert} key= {p.key}")
        if args.detach:
            print(f"Detached: `{down_command(args)}` stops it.")
            return 0
        print("Ctrl-C to stop.", flush=True)
        while True:
            time.sleep(1.0)
    except ClusterError as e:
        print(f"bubblespec ray up: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bubblespec ray up: stopping", flush=True)
        cluster.stop()
        return 0


def main(argv: Sequence[str]) -> int:
    """Entry point of `bubblespec ray`."""
    args = parse_args(argv)
    if args.action == "up":
        return _up(args)
    import ray

    from bubblespec.cluster.ray import ray_down, ray_status

    ray.init(address=args.address or "auto", namespace=args.namespace, log_to_driver=False)
    if args.action == "status":
        found = ray_status(args.name, args.namespace)
        print(json.dumps(found, indent=2, sort_keys=True))
        return 0 if found else 1
    stopped = ray_down(args.name, args.namespace, args.grace_s)
    print(f"bubblespec ray down: stopped {', '.join(stopped) or 'nothing'}")
    return 0
