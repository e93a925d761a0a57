"""Configuration of the gateway (`bubblespec gateway --help` shows these fields).

Sources, by precedence: CLI flags > env (`BUBBLESPEC_GATEWAY_<FIELD>`) > YAML (`--config`) >
defaults (see `bubblespec/config.py`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from bubblespec.config import BaseConfig
from bubblespec.protocol.sampling import PregenWindow, SeedMode
from bubblespec.tls import TlsSettings

ENV_PREFIX = "BUBBLESPEC_GATEWAY_"
MiB = 1024 * 1024


class GatewayConfig(BaseConfig, TlsSettings):
    """bubblespec gateway: the trainer's one address; shards rollouts over the rank servers.

    TLS (`tls_*`, declared in `bubblespec/tls.py`): HTTPS with tls_cert; with tls_ca the
    synchronizer and the ranks (`https://` for a `host:port`) are called over TLS, verified
    against it, presenting tls_cert."""

    host: str = "127.0.0.1"
    """Interface the HTTP server binds (0.0.0.0 for all)."""
    port: int = Field(8000, ge=0, le=65535)
    """HTTP port."""
    sync_address: str = ""
    """host:port of the synchronizer (empty: no synchronizer; ranks decode without drafts)."""
    sync_token: SecretStr | None = None
    """Bearer token for the synchronizer's mutating RPCs."""
    pregen_window: PregenWindow = PregenWindow.BUBBLE
    """Default pre-gen window of a step: until the slowest rank is done ("bubble"), or on
    through the training window until the next step or weight push ("training": for
    disaggregated set-ups whose rollout ranks idle while the trainer trains; not for
    colocated engines that sleep during training)."""
    pregen_drain_s: float = Field(5.0, ge=0)
    """Before a step, wait up to this long for ranks still pre-generating to push their drafts."""
    sync_timeout_s: float = Field(2.0, gt=0)
    """Deadline of each synchronizer RPC, seconds."""
    ranks: list[str] = Field(default_factory=list)
    """Static rank servers (`http://host:port` or `host:port`), besides those registered at the
    synchronizer; e.g. `["127.0.0.1:8101", "127.0.0.1:8102"]`."""
    discover_ranks: bool = True
    """Also use the ranks registered (and not LOST) at the synchronizer."""
    token: SecretStr | None = None
    """Bearer token required on the mutating routes (POST /v1/rollout, POST /v1/weights)."""
    rank_token: SecretStr | None = None
    """Bearer token sent to the rank servers' POST routes."""
    run_seed: int = Field(0, ge=0, lt=2**63)
    """Run seed: per-sample seeds are derived from (run seed, step, prompt key, sample index)
    when the trainer gives none, and the next step's pre-generation uses the same rule."""
    handoff_seed_mode: SeedMode = SeedMode.KEYED
    """Seed mode of a step that hands next prompts ahead (or whose prompts the step before
    handed ahead) when its sampling_params leave seed_mode unset: "keyed" (exact, and
    coupled to the drafts pre-generated with the same seeds), "keyed_context", or "default"
    (vLLM's sampler). A request that sets seed_mode keeps it."""
    tokenizer: str = ""
    """tokenizer.json, or a model directory holding one, for text prompts and the `text` of
    the SGLang-compatible /generate answers (empty: the embedded task's tokenizer)."""
    vocab_size: int = Field(0, ge=-1)
    """Token ids must be below this (0: the tokenizer's vocabulary size; -1: no check)."""
    max_prompts: int = Field(16_384, ge=1)
    """Most prompts in one rollout (and in each batch of next_prompts)."""
    max_lookahead_steps: int = Field(8, ge=1, le=64)
    """Most future steps one rollout may hand prompts ahead for (`next_prompts` as a list of
    batches); the synchronizer's own limit must be as large."""
    max_prompt_tokens: int = Field(131_072, ge=1)
    """Most tokens of one prompt."""
    max_n: int = Field(1024, ge=1, le=1024)
    """Most samples per prompt."""
    max_new_tokens: int = Field(131_072, ge=1)
    """Largest sampling_params.max_new_tokens accepted."""
    max_body_bytes: int = Field(256 * MiB, ge=1024)
    """Largest accepted HTTP request body, bytes (413 beyond)."""
    rollout_timeout_s: float = Field(3600.0, gt=0)
    """Deadline of one rollout (all ranks, re-runs included), seconds."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """TCP connect deadline towards a rank, seconds."""
    probe_timeout_s: float = Field(3.0, gt=0)
    """Deadline of a rank state probe (GET /v1/state), seconds."""
    weights_timeout_s: float = Field(900.0, gt=0)
    """Deadline of a weight update on each rank, seconds."""
    lost_poll_s: float = Field(1.0, gt=0)
    """While a step's shards run, ask the synchronizer this often for ranks it marked LOST
    (no heartbeat): their calls fail at once and their shards re-run elsewhere (a frozen or
    partitioned rank never answers nor closes its connection), seconds."""
    max_reruns: int = Field(8, ge=0)
    """Most shard re-runs (after rank failures) in one rollout before giving up."""
    quarantine_s: float = Field(600.0, ge=0)
    """A request whose engines died on two ranks is refused (422) for this long, seconds
    (0: never refused; docs/design.md, "Poison requests")."""
    length_ema: float = Field(0.5, gt=0, le=1)
    """Weight of the newest observation in the per-prompt response-length estimate."""
    length_keys: int = Field(1_000_000, ge=1)
    """Most prompt keys whose response length is remembered (oldest forgotten first)."""
    split_samples: bool = True
    """When a batch has fewer prompts than live ranks, split a prompt's samples over ranks."""
    return_token_ids: bool = False
    """Answer every OpenAI-API request with its token ids, as if it sent vLLM's
    `return_token_ids: true` (a request that sends false keeps false): ART runs vLLM patched
    this way, so its clients never send the field."""
    enable_auto_tool_choice: bool = False
    """Serve tool_choice "auto" on /v1/chat/completions (the default when `tools` are
    given): each choice is parsed by vLLM's tool parser `tool_call_parser` on a rank (vLLM's
    `--enable-auto-tool-choice`). Without it "auto" is refused, as vLLM refuses it."""
    tool_call_parser: str = Field("", max_length=256)
    """vLLM's tool-call parser for tool_choice "auto" (vLLM's `--tool-call-parser`, e.g.
    hermes, llama3_json, pythonic, mistral), run by the ranks' vLLM."""
    sglang_quiet_s: float = Field(0.05, gt=0, le=60)
    """SGLang-compatible /generate: queued requests become one step once none arrived for
    this long (seconds)."""
    sglang_max_wait_s: float = Field(1.0, gt=0, le=600)
    """... or at most this long after the first queued request (seconds)."""
    keep_steps: int = Field(64, ge=1)
    """Rollout summaries kept for GET /v1/steps/{step}."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level."""

    @model_validator(mode="after")
    def _parser_for_auto(self) -> GatewayConfig:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (vLLM's "
                             "--enable-auto-tool-choice requires --tool-call-parser)")
        return self
