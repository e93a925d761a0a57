"""The synchronizer daemon: `bubblespec sync [--host H] [--port P] [--config F] [--token T]`.

One grpc.aio server on one event loop carries the Synchronizer service and the standard
`grpc.health.v1` service (overall "" and "bubblespec.rpc.v1.Synchronizer": NOT_SERVING until
ready, SERVING while up, NOT_SERVING again once shutdown starts), over TLS when the config
names a certificate (`tls_*`, `bubblespec/tls.py`; mutual with `tls_client_auth`). A background task marks
silent ranks LOST. Prometheus metrics are served over HTTP on `--metrics-port`. SIGTERM/SIGINT
shut down gracefully: health flips, WatchStep streams end, in-flight RPCs get
`shutdown_grace_s`. With `journal_path` the daemon replays its journal (`journal.py`) before
it binds, so it serves its restored state from its first call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from typing_extensions import Self

from bubblespec.http.serve import service_main
from bubblespec.metrics import new_registry, serve_metrics
from bubblespec.metrics.sync import SyncMetrics
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.rpc.v1 import synchronizer_pb2_grpc as pb_grpc
from bubblespec.synchronizer.config import SyncConfig
from bubblespec.synchronizer.journal import Journal
from bubblespec.synchronizer.service import SynchronizerService
from bubblespec.synchronizer.state import SyncState
from bubblespec.tls import server_credentials

log = logging.getLogger("bubblespec.synchronizer")

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Synchronizer"].full_name


class SyncServer:
    """A running (after `start()`) synchronizer; also an async context manager."""

    def __init__(self, config: SyncConfig) -> None:
        self.config = config
        self.registry = new_registry("synchronizer")
        self.metrics = SyncMetrics(self.registry)
        self.state = SyncState(config, self.metrics)
        self.metrics.watch_levels(self.state.levels)
        self.health = health_aio.HealthServicer()
        self.port = 0
        self.metrics_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics_http: Any = None
        self._reaper: asyncio.Task[None] | None = None
        self.service = SynchronizerService(self.state, config, self.metrics)
        self.journal: Journal | None = None
        self.replayed: tuple[int, int] = (0, 0)
        """(requests applied, refused) from the journal at start."""

    @property
    def address(self) -> str:
        """host:port clients should dial (loopback when bound to all interfaces)."""
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::", "") else self.config.host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Bind, start serving, then report SERVING. Raises RuntimeError if the port is taken."""
        c = self.config
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", c.max_message_bytes),
            ("grpc.max_send_message_length", c.max_message_bytes),
            ("grpc.so_reuseport", 0),  # a second daemon on the same port must fail, not share
            # clients keep WatchStep streams alive with 10 s pings
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
            ("grpc.keepalive_permit_without_calls", 1),
        ])
        if c.journal_path:
            self._replay_journal(c.journal_path, c.journal_fsync)
        pb_grpc.add_SynchronizerServicer_to_server(self.service, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        creds = server_credentials(c)
        try:
            if creds is None:
                self.port = self._server.add_insecure_port(f"{c.host}:{c.port}")
            else:
                self.port = self._server.add_secure_port(f"{c.host}:{c.port}", creds)
        except RuntimeError as e:
            raise RuntimeError(f"cannot bind {c.host}:{c.port}: {e}") from e
        if not self.port:
            raise RuntimeError(f"cannot bind {c.host}:{c.port}")
        await self._server.start()
        if c.metrics_port >= 0:
            self._metrics_http, self.metrics_port = serve_metrics(
                self.registry, c.metrics_port, c.metrics_host)
        self._reaper = asyncio.create_task(self._reap_forever(), name="sync-reaper")
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("synchronizer %s listening on %s:%d (metrics: %s, auth: %s, tls: %s)",
                 self.state.instance_id, c.host, self.port,
                 f"http://{c.metrics_host}:{self.metrics_port}/metrics"
                 if self.metrics_port is not None else "off",
                 "bearer token" if c.token else "none",
                 ("mutual" if c.tls_client_auth else "server") if c.tls_server else "off")

    def _replay_journal(self, path: str, fsync: bool) -> None:
        """Restore the state the journal at `path` holds, then journal to it."""
        journal = Journal(path, fsync)
        t0 = time.perf_counter()
        records = journal.load()
        self.replayed = self.service.replay(records)
        self.service.attach_journal(journal)
        self.journal = journal
        cur, store = self.state.current, self.state.store
        if records:
            log.info("journal %s: %d requests replayed (%d refused) in %.2f s: step %s%s, "
                     "%d ranks, %d drafts (%d tokens) restored", path, self.replayed[0],
                     self.replayed[1], time.perf_counter() - t0,
                     cur.step if cur else "none",
                     "" if cur is None or cur.closed_unix_s is None else " (closed)",
                     len(self.state.ranks), store.sequences, store.tokens)
        else:
            log.info("journal %s: new", path)

    async def _reap_forever(self) -> None:
        period = max(0.02, min(self.config.heartbeat_interval_s, self.config.rank_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            for rank_id in self.state.reap():
                log.warning("rank %s LOST: no heartbeat for %.1f s", rank_id,
                            self.config.rank_timeout_s)

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop: NOT_SERVING, end WatchStep streams, let RPCs finish, close."""
        await self.health.enter_graceful_shutdown()
        self.state.events.close()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        if self._server is not None:
            grace = self.config.shutdown_grace_s if grace_s is None else grace_s
            await self._server.stop(grace)
            self._server = None
        if self.journal is not None:
            self.journal.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None
        log.info("synchronizer %s stopped", self.state.instance_id)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop(0)


async def serve(config: SyncConfig) -> int:
    """Run the daemon until SIGTERM or SIGINT; 0 on a clean stop."""
    server = SyncServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received: shutting down (grace %.1f s)", config.shutdown_grace_s)
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `bubblespec sync`: parse config, log it, serve."""

    def run(config: SyncConfig) -> int:
        try:
            return asyncio.run(serve(config))
        except RuntimeError as e:
            log.error("%s", e)
            return 1

    return service_main(SyncConfig, argv, run, prog="bubblespec sync")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
