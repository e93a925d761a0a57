"""Configuration of a rank server (`bubblespec rank --help` shows these fields).

The rank's own settings (address, synchronizer, pre-generation) are declared here; every
engine setting is inherited from `EngineConfig`, declared and documented once there, so
each one is a `bubblespec rank` flag, a `BUBBLESPEC_RANK_<FIELD>` variable and a config-file
key under the same name, and `engine_config()` copies them all without naming any. This
module (and `bubblespec.engine.config`) imports neither vLLM nor torch: the configuration is
parsed before the engine starts.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr

from bubblespec.config import BaseConfig
from bubblespec.engine.config import EngineConfig
from bubblespec.protocol.limits import MAX_BRANCH_OFFERS
from bubblespec.tls import TlsSettings

ENV_PREFIX = "BUBBLESPEC_RANK_"


class RankConfig(BaseConfig, EngineConfig, TlsSettings):
    """bubblespec rank server: one vLLM engine, its shard of each step, pre-generation.

    TLS (`tls_*`, declared in `bubblespec/tls.py`): HTTPS with tls_cert; with tls_ca the
    synchronizer is called over TLS, verified against it, presenting tls_cert."""

    rank_id: str = Field("", max_length=128)
    """Rank name (default: r<ordinal> from a StatefulSet hostname, else rank-<port>)."""
    host: str = "127.0.0.1"
    """Interface the HTTP server binds (0.0.0.0 for all)."""
    port: int = Field(8100, ge=0, le=65535)
    """HTTP port."""
    advertise_address: str = ""
    """host:port the synchronizer and gateway reach this rank at (default host:port)."""
    sync_address: str = ""
    """host:port of the synchronizer (empty: run alone, no pre-generation or shared drafts)."""
    sync_token: SecretStr | None = None
    """Bearer token for the synchronizer's mutating RPCs."""
    token: SecretStr | None = None
    """Bearer token required on this server's mutating routes."""
    sync_timeout_s: float = Field(2.0, gt=0)
    """Deadline of each synchronizer RPC, seconds."""
    drafts_port: int = Field(-1, ge=-1, le=65535)
    """Serve the drafts this rank pushed to the other ranks on this gRPC port (the DraftPeer
    service, TLS as this rank's server; 0: any free port), and fetch drafts from the ranks
    that serve theirs: the fetch burst at a step's start goes rank to rank, with the
    synchronizer saying where and serving what a rank cannot (`synchronizer/peer.py`).
    -1: off, every draft's bytes go through the synchronizer."""
    poll_every: int = Field(8, ge=1)
    """T: decode steps between stop polls while pre-generating."""
    pregen_inflight: int = Field(64, ge=1)
    """Most pre-generation tasks decoding at once (refilled as each finishes)."""
    pregen_branches: int = Field(1, ge=0, le=MAX_BRANCH_OFFERS)
    """Margin branches each keyed draft offers, at its smallest keyed margins; the rank also
    decodes branch tasks the synchronizer hands out after the plain tasks (0: neither;
    docs/design.md section 5). Only keyed (position) sampling branches: other drafts offer
    nothing and ask for no log-probs."""
    pregen_branch_margin: Annotated[float, Field(ge=0.0, le=100.0)] | Literal["auto"] = "auto"
    """Stream branch offers: a keyed draft still decoding offers each position whose keyed
    margin is below this at once, with the partial draft so far, so its branch starts before
    the draft completes (0: offers only with the complete draft; needs pregen_branches).
    auto: the synchronizer's threshold, calibrated from where responses flipped away from
    their drafts (`core/branch_margin.py`; 0 until the first flip)."""
    tail_fill_budget: float = Field(0.0, ge=0.0, le=1.0)
    """Tail-fill: start pre-generating the next steps' tasks while this rank's own requests
    still decode, with as many lanes as keep a modelled decode forward within (1 + this) x
    its own (e.g. 0.05: 5% longer); own requests are admitted first. 0: off, pre-generation
    starts when the shard is done (docs/design.md, "Tail-fill"; the default follows the
    paced measurement in docs/results.md)."""
    tail_fill_gpu: Literal["h100", "h200"] = "h100"
    """The engine-time model (8B model on this GPU) the tail-fill budget is judged with when
    the engine is not paced; a paced engine uses its `pace` profile."""
    engine_restarts: int = Field(3, ge=0, le=1000)
    """Engine restarts this process may make per engine_restart_window_s after its engine
    died (with the last good weights; failed attempts count); when that many happened within
    the window and the engine dies again, the process exits non-zero so that its supervisor
    (bubblespec up, compose, Kubernetes, Ray) restarts it."""
    engine_restart_window_s: float = Field(600.0, gt=0, le=7 * 24 * 3600)
    """Seconds of the sliding window over which engine_restarts is counted: deaths spread
    out further than the budget allows never make the process exit."""
    engine_check_s: float = Field(0.5, gt=0, le=60)
    """Seconds between two checks that the engine is alive."""
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """Largest accepted HTTP request body, bytes."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level."""

    def engine_config(self) -> EngineConfig:
        """The engine settings of this rank (every `EngineConfig` field, as configured)."""
        return EngineConfig.model_validate(
            {name: getattr(self, name) for name in EngineConfig.model_fields})
