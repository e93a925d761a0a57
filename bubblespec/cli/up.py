"""`bubblespec up`: a local cluster (synchronizer, N rank servers, gateway) as child processes.

    bubblespec up --ranks 2 [--model DIR] [--rank-arg=--spec-mode=none] [--log-dir DIR] [--tls]

Starts a `LocalCluster` (bubblespec/cluster/local.py), prints the addresses once every child
is ready, and serves until Ctrl-C or SIGTERM (exit 0). A child that exits afterwards (a rank
whose engine restarts are spent, a crash, a kill) is reported and started again after a
backoff (1 s doubling to 30 s) while the gateway routes around it; only a child that keeps
dying, once more after `--give-up-restarts` (10) restarts within `--give-up-window-s` (600 s),
stops the rest, and the command exits 1 with that child's log tail. A child that dies during
start fails the start the same way. `--tls` makes a throwaway CA and one certificate in
`<log-dir>/tls/` and runs every child with mutual TLS; the addresses printed then include
the CA, certificate and key a client needs (`BubbleSpecClient(url, ca=, cert=, key=)`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from bubblespec.cli.signals import stop_on_sigterm
from bubblespec.cluster import ClusterError, LocalCluster


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bubblespec up", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="rank servers to start [2]")
    p.add_argument("--model", default=None, help="HF model directory [embedded tiny model]")
    p.add_argument("--rank-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every rank, e.g. --rank-arg=--spec-mode=none")
    p.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the gateway")
    p.add_argument("--sync-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the synchronizer")
    p.add_argument("--log-dir", default=None, help="where child logs go [a new temp dir]")
    p.add_argument("--host", default="127.0.0.1", help="interface for every child")
    p.add_argument("--gateway-port", type=int, default=0, help="gateway port [free port]")
    p.add_argument("--sync-port", type=int, default=0, help="synchronizer port [free port]")
    p.add_argument("--token", default=None, help="bearer token for every service")
    p.add_argument("--tls", action="store_true",
                   help="mutual TLS between every service and towards clients, with a "
                        "throwaway CA made in <log-dir>/tls/ (its paths are printed)")
    p.add_argument("--start-timeout-s", type=float, default=600.0,
                   help="give up if not ready after this long [600]")
    p.add_argument("--grace-s", type=float, default=10.0,
                   help="SIGTERM -> SIGKILL grace period at shutdown [10]")
    p.add_argument("--give-up-restarts", type=int, default=10,
                   help="stop when a child dies again after this many restarts within "
                        "--give-up-window-s [10]")
    p.add_argument("--give-up-window-s", type=float, default=600.0,
                   help="the window of --give-up-restarts, seconds [600]")
    p.add_argument("--no-supervise", dest="supervise", action="store_false",
                   help="stop at the first child that exits instead of restarting it")
    args = p.parse_args(list(argv))
    if args.ranks < 1:
        p.error("--ranks must be >= 1")
    if args.give_up_restarts < 0:
        p.error("--give-up-restarts must be >= 0")
    if not args.give_up_window_s > 0:
        p.error("--give-up-window-s must be > 0")
    return args


def _report_children() -> None:
    """Print the supervisor's reports (each exit, restart and give-up) on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("bubblespec up: %(message)s"))
    logger = logging.getLogger("bubblespec.cluster")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main(argv: Sequence[str]) -> int:
    """Entry point of `bubblespec up`."""
    args = parse_args(argv)
    cluster = LocalCluster(
        ranks=args.ranks, model=args.model, rank_args=args.rank_arg,
        gateway_args=args.gateway_arg, sync_args=args.sync_arg, log_dir=args.log_dir,
        host=args.host, gateway_port=args.gateway_port, sync_port=args.sync_port,
        token=args.token, start_timeout_s=args.start_timeout_s, grace_s=args.grace_s,
        supervise=args.supervise, give_up_restarts=args.give_up_restarts,
        give_up_window_s=args.give_up_window_s, tls=args.tls)
    _report_children()
    stop_on_sigterm()
    try:
        print(f"bubblespec up: starting {args.ranks} rank(s); logs in "
              f"{cluster.log_dir or '(temp dir)'}", flush=True)
        cluster.start()
        print("bubblespec up: ready")
        for k, v in cluster.addresses().items():
            print(f"  {k:<13} {v}")
        if cluster.pki is not None:
            p = cluster.pki
            print(f"TLS: clients verify the servers with --tls-ca/ca= {p.ca} and present "
                  f"--tls-cert/cert= {p.cert} --tls-key/key= {p.key}")
        print("Ctrl-C to stop.", flush=True)
        while True:
            if args.supervise:
                failed = [(name, ev.returncode) for name, ev in cluster.gave_up.items()]
            else:
                failed = [(c.name, c.proc.returncode) for c in cluster.children.values()
                          if c.proc is not None and not c.alive]
            if failed:
                name, code = failed[0]
                c = cluster.children[name]
                why = (f"exited with code {code} and keeps dying" if args.supervise
                       else f"exited with code {code}")
                print(f"bubblespec up: {name} {why}; stopping (log {c.log_path}):\n"
                      f"{c.log_tail()}", file=sys.stderr, flush=True)
                cluster.stop()
                return 1
            time.sleep(0.5)
    except ClusterError as e:
        print(f"bubblespec up: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bubblespec up: stopping", flush=True)
        cluster.stop()
        return 0
