"""`bubblespec health`: a probe for container healthchecks and scripts.

    bubblespec health --grpc HOST:PORT [--service NAME]   # grpc.health.v1 Check
    bubblespec health --http URL                          # GET, healthy on 200

`--grpc` asks the standard gRPC health service (the synchronizer's) and is healthy when the
answer is SERVING. `--http` is healthy on a 200 answer (a rank's or the gateway's
`/health_generate`; `host:port` alone means `http://host:port/health_generate`). Each check has
a deadline (`--timeout-s`). Exit status: 0 healthy, 1 unhealthy or unreachable, 2 bad usage.
A one-line verdict goes to stdout when healthy and to stderr otherwise (`--quiet`: nothing on
success). Only the standard library and, for `--grpc`, grpcio are imported (and
`bubblespec.tls` with `--tls-ca`), so a probe every few seconds stays cheap. Over TLS: `--tls-ca PEM` verifies the server (the gRPC check then
uses TLS, and `host:port` means https:// for `--http`), `--tls-cert`/`--tls-key` present a
client certificate to a server that requires one.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

HEALTHY, UNHEALTHY, USAGE = 0, 1, 2
DEFAULT_HTTP_PATH = "/health_generate"


def normalise_url(target: str, scheme: str = "http") -> str:
    """`host:port` -> `<scheme>://host:port/health_generate`; a URL with a scheme is kept as
    is (a bare `http://host:port` gets the `/health_generate` path)."""
    if "://" not in target:
        target = f"{scheme}://{target}"
    parts = urllib.parse.urlsplit(target)
    if parts.path in ("", "/"):
        parts = parts._replace(path=DEFAULT_HTTP_PATH)
    return urllib.parse.urlunsplit(parts)


def check_grpc(address: str, service: str, timeout_s: float,
               credentials: Any = None) -> tuple[int, str]:
    """(exit status, message) of a grpc.health.v1 Check of `service` at `address` (over TLS
    with `credentials`, `grpc.ChannelCredentials`)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    label = f"grpc {address}" + (f" service {service!r}" if service else "")
    channel = (grpc.insecure_channel(address) if credentials is None
               else grpc.secure_channel(address, credentials))
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s,
                wait_for_ready=False)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            name = code.name if code is not None else "ERROR"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return UNHEALTHY, f"{label}: no answer within {timeout_s:g} s"
            if code == grpc.StatusCode.NOT_FOUND:
                return UNHEALTHY, f"{label}: the health service does not know this service"
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return UNHEALTHY, f"{label}: no grpc.health.v1 service there"
            detail = e.details() if hasattr(e, "details") else str(e)
            return UNHEALTHY, f"{label}: unreachable ({name}: {detail})"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        return HEALTHY, f"{label}: {status}"
    return UNHEALTHY, f"{label}: {status}"


def check_http(url: str, timeout_s: float,
               context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """(exit status, message) of a GET of `url`: healthy on 200 (`context`: of https)."""
    req = urllib.request.Request(url, headers={"User-Agent": "bubblespec-health"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            code = resp.status
            body = resp.read(300).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        body = e.read(300).decode("utf-8", "replace") if e.fp is not None else ""
        return UNHEALTHY, f"GET {url}: HTTP {e.code} {body.strip()}".rstrip()
    except TimeoutError:
        return UNHEALTHY, f"GET {url}: no answer within {timeout_s:g} s"
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError):
            return UNHEALTHY, f"GET {url}: no answer within {timeout_s:g} s"
        return UNHEALTHY, f"GET {url}: unreachable ({reason})"
    except OSError as e:  # connection reset mid-answer, etc.
        return UNHEALTHY, f"GET {url}: {type(e).__name__}: {e}"
    if code == 200:
        return HEALTHY, f"GET {url}: 200 {body.strip()}".rstrip()
    return UNHEALTHY, f"GET {url}: HTTP {code} {body.strip()}".rstrip()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bubblespec health",
        description="Probe a bubblespec process: exit 0 if healthy, 1 if not, 2 on bad usage.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--grpc", metavar="HOST:PORT",
                      help="grpc.health.v1 Check; healthy when SERVING (the synchronizer)")
    what.add_argument("--http", metavar="URL",
                      help="HTTP GET; healthy on 200 (host:port alone means "
                           f"http://host:port{DEFAULT_HTTP_PATH})")
    p.add_argument("--service", default="",
                   help="gRPC service name to check (default: the server's overall health)")
    p.add_argument("--timeout-s", type=float, default=3.0,
                   help="deadline of the check, seconds [3]")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing when healthy")
    p.add_argument("--tls-ca", metavar="PEM", default="",
                   help="TLS: verify the server against this CA (--grpc over TLS; host:port "
                        "with --http means https://)")
    p.add_argument("--tls-cert", metavar="PEM", default="",
                   help="TLS: client certificate, for a server that requires one")
    p.add_argument("--tls-key", metavar="PEM", default="", help="TLS: key of --tls-cert")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bubblespec health`."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse: 0 for --help, 2 for bad usage
        return int(e.code or 0)
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_cert and not args.tls_ca):
        print("bubblespec health: --tls-cert and --tls-key go together, with --tls-ca",
              file=sys.stderr)
        return USAGE
    for path in (args.tls_ca, args.tls_cert, args.tls_key):
        if path and not os.path.isfile(path):
            print(f"bubblespec health: no such file: {path}", file=sys.stderr)
            return USAGE
    if not args.timeout_s > 0:
        print("bubblespec health: --timeout-s must be > 0", file=sys.stderr)
        return USAGE
    if args.grpc is not None:
        if args.grpc.count(":") < 1 or args.grpc.startswith(("http://", "https://")):
            print(f"bubblespec health: --grpc wants HOST:PORT, got {args.grpc!r}",
                  file=sys.stderr)
            return USAGE
        creds = None
        if args.tls_ca:
            from bubblespec.tls import channel_credentials

            creds = channel_credentials(args.tls_ca, args.tls_cert or None,
                                        args.tls_key or None)
        status, message = check_grpc(args.grpc, args.service, args.timeout_s, creds)
    else:
        url = normalise_url(args.http, "https" if args.tls_ca else "http")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            print(f"bubblespec health: --http wants an http(s) URL, got {args.http!r}",
                  file=sys.stderr)
            return USAGE
        context = None
        if args.tls_ca:
            from bubblespec.tls import client_context

            context = client_context(args.tls_ca, args.tls_cert or None, args.tls_key or None)
        status, message = check_http(url, args.timeout_s, context)
    if status == HEALTHY:
        if not args.quiet:
            print(f"healthy: {message}")
    else:
        print(f"bubblespec health: UNHEALTHY: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
