"""What every way of running a bubblespec cluster offers its callers.

A cluster is one synchronizer, N rank servers and one gateway, started together and
stopped together. Callers (the `bubblespec up` and `bubblespec run` commands, the
benchmarks, the tests) only need its addresses and its lifetime, so they are written
against `Cluster`; `LocalCluster` (child processes on this host) and `RayCluster` (Ray
actors, `cluster/ray.py`) implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from typing_extensions import Self


class ClusterError(RuntimeError):
    """The cluster could not start (a member died or was not ready in time)."""


class Cluster(ABC):
    """A synchronizer, rank servers and a gateway with one lifetime.

    `start()` returns once every member is ready (the gateway sees every rank) or raises
    `ClusterError` with everything stopped; `stop()` stops every member and is safe to call
    twice. Used as a context manager: `with SomeCluster(...) as c: ... c.gateway_url`.
    """

    @property
    @abstractmethod
    def gateway_url(self) -> str:
        """Base URL of the gateway (what trainers and `BubbleSpecClient` call)."""

    @property
    @abstractmethod
    def sync_address(self) -> str:
        """host:port of the synchronizer's gRPC service."""

    @property
    @abstractmethod
    def rank_ids(self) -> list[str]:
        """The ranks' ids, `r0` ... `r{N-1}`."""

    @property
    @abstractmethod
    def rank_urls(self) -> dict[str, str]:
        """Base URL of each rank server, by rank id."""

    @abstractmethod
    def addresses(self) -> dict[str, Any]:
        """Every address worth printing (gateway, synchronizer and its metrics, ranks)."""

    def client_tls(self) -> dict[str, str]:
        """The `ca`/`cert`/`key` keyword arguments of `BubbleSpecClient` for this cluster's
        gateway: empty when the cluster runs without TLS."""
        return {}

    @abstractmethod
    def start(self) -> Self:
        """Start every member and wait until all are ready; `ClusterError` if not."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every member (gracefully, then forcibly after a grace period)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
