"""Configuration of the synchronizer daemon (`bubblespec sync --help` shows these fields)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from bubblespec.config import BaseConfig
from bubblespec.tls import TlsSettings

MiB = 1024 * 1024


class SyncConfig(BaseConfig, TlsSettings):
    """bubblespec synchronizer: step coordination, pre-generation queue, draft store.

    TLS (`tls_*`, declared in `bubblespec/tls.py`): the gRPC server serves TLS with tls_cert,
    and with tls_client_auth refuses ranks and gateways without a certificate from tls_ca."""

    host: str = "127.0.0.1"
    """Interface the gRPC server binds (0.0.0.0 for all)."""
    port: int = Field(50051, ge=0, le=65535)
    """gRPC port (0 = any free port; the chosen one is logged)."""
    metrics_host: str = "0.0.0.0"
    """Interface of the Prometheus /metrics HTTP endpoint."""
    metrics_port: int = Field(9464, ge=-1, le=65535)
    """Port of the Prometheus /metrics HTTP endpoint (0 = any free port, -1 = off)."""
    token: SecretStr | None = None
    """Bearer token required on mutating RPCs (metadata `authorization: Bearer <token>`)."""
    heartbeat_interval_s: float = Field(2.0, gt=0)
    """How often ranks are told to heartbeat, in seconds."""
    rank_timeout_s: float = Field(10.0, gt=0)
    """A rank without heartbeat for this long is marked LOST (and done for the current step)."""
    poll_every_decode_steps: int = Field(8, ge=1)
    """Default T: ranks poll PollStop every T decode steps while pre-generating."""
    max_message_bytes: int = Field(64 * MiB, ge=64 * 1024)
    """Largest gRPC message accepted or sent, in bytes."""
    draft_store_budget_bytes: int = Field(1024 * MiB, ge=0)
    """Byte budget of the draft store (4 B/token + key + 64 B/sequence); full -> rejected."""
    max_tasks_per_step: int = Field(262_144, ge=1)
    """Most pre-generation tasks (prompt x sample) one OpenStep may carry."""
    max_lookahead_steps: int = Field(8, ge=1, le=64)
    """Furthest future step an OpenStep may hand prompts for (1: the next step only). The
    limit on tasks applies to each future step."""
    max_tasks_per_claim: int = Field(1024, ge=1)
    """Most tasks one ClaimTasks call hands out (larger requests are clamped)."""
    pregen_depth: int = Field(1, ge=1)
    """Samples of one prompt per round of the pre-gen queue (1: breadth-first over prompts;
    >= n: all samples of the prompt predicted longest first)."""
    max_prompt_tokens: int = Field(262_144, ge=1)
    """Most prompt tokens of one pre-generation task."""
    max_draft_tokens: int = Field(262_144, ge=1)
    """Most tokens of one draft (and largest max_new_tokens of a task)."""
    max_drafts_per_push: int = Field(4096, ge=1)
    """Most drafts in one PushDrafts call."""
    max_fetch_keys: int = Field(8192, ge=1)
    """Most prompt keys in one FetchDrafts call."""
    vocab_size: int = Field(0, ge=0, le=2**31 - 1)
    """Token ids in pushed drafts and pre-generation prompts must be below this; 0: below the
    smallest vocabulary the registered ranks report (no upper check before one has)."""
    max_key_bytes: int = Field(1024, ge=1)
    """Longest prompt_key / rank_id / address, in UTF-8 bytes."""
    max_spans_per_report: int = Field(4096, ge=1)
    """Most spans in one ReportSpans call."""
    max_spans_per_rank_step: int = Field(65_536, ge=1)
    """Spans kept per rank and step; more are dropped (counted, not an error)."""
    timeline_keep_steps: int = Field(32, ge=1)
    """How many recent steps the timeline keeps."""
    journal_path: str = ""
    """File where the daemon journals every state change it acknowledged (ranks, steps,
    tasks handed, drafts stored) and which it replays when it starts: a daemon restarted on
    the same file comes back with its step, its queue and its drafts. Empty: no journal (a
    restart starts empty; rollouts go on, the drafts stored so far are lost)."""
    journal_fsync: bool = False
    """fsync the journal after each record: survives the machine's crash as well as the
    daemon's (the default survives the daemon's death: records reach the OS first)."""
    shutdown_grace_s: float = Field(5.0, ge=0)
    """On SIGTERM/SIGINT: seconds in-flight RPCs get before the server stops."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of the daemon."""

    @model_validator(mode="after")
    def _timeout_after_interval(self) -> SyncConfig:
        if self.rank_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"rank_timeout_s ({self.rank_timeout_s}) must exceed heartbeat_interval_s "
                f"({self.heartbeat_interval_s}), or every rank would be marked LOST"
            )
        return self
