"""Field-level validation of every request, before it touches the state.

Each check raises INVALID_ARGUMENT naming the field's path (`drafts[3].token_ids[17]`), so a
caller can find its bug without reading the daemon's logs. Limits come from `SyncConfig`.
Checks that depend on the state (unknown rank, step not open) live in `state.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import ValidationError

from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.synchronizer.config import SyncConfig
from bubblespec.synchronizer.convert import (
    RANK_STATE_FROM_PB,
    SPAN_KIND_FROM_PB,
    sampling_from_pb,
)
from bubblespec.synchronizer.errors import invalid


class Validator:
    """Validates requests against the configured limits."""

    def __init__(self, config: SyncConfig) -> None:
        self.c = config

    # ------------------------------------------------------------------ building blocks

    def key(self, value: str, path: str) -> None:
        """Non-empty identifier (rank_id, prompt_key) within max_key_bytes."""
        if not value:
            raise invalid(path, "must not be empty")
        if len(value.encode()) > self.c.max_key_bytes:
            raise invalid(path, f"longer than {self.c.max_key_bytes} bytes")

    @staticmethod
    def non_negative(value: int, path: str) -> None:
        if value < 0:
            raise invalid(path, f"must be >= 0, got {value}")

    def tokens(self, ids: Sequence[int], path: str, limit: int, offset: int = 0) -> None:
        """Token ids >= 0 and at most `limit` of them (counting `offset` earlier ones)."""
        if offset + len(ids) > limit:
            raise invalid(path, f"{offset + len(ids)} tokens exceed the limit of {limit}")
        if ids and min(ids) < 0:
            i = next(i for i, t in enumerate(ids) if t < 0)
            raise invalid(f"{path}[{i}]", f"token id must be >= 0, got {ids[i]}")

    def count(self, n: int, limit: int, path: str) -> None:
        if n > limit:
            raise invalid(path, f"{n} entries exceed the limit of {limit}")

    # ------------------------------------------------------------------ requests

    def register(self, r: pb.RegisterRankRequest) -> None:
        self.key(r.rank_id, "rank_id")
        if len(r.address.encode()) > self.c.max_key_bytes:
            raise invalid("address", f"longer than {self.c.max_key_bytes} bytes")
        if r.HasField("capacity") and r.capacity < 1:
            raise invalid("capacity", f"must be >= 1 when set, got {r.capacity}")
        self.non_negative(r.weight_version, "weight_version")

    def heartbeat(self, r: pb.HeartbeatRequest) -> None:
        self.key(r.rank_id, "rank_id")
        if r.state not in RANK_STATE_FROM_PB or r.state == pb.RANK_STATE_LOST:
            raise invalid("state", f"{r.state} is not a state a rank can report")
        self.non_negative(r.weight_version, "weight_version")
        for name in ("step", "done_step"):
            if r.HasField(name):
                self.non_negative(getattr(r, name), name)

    def step_and_rank(self, r: pb.ReportDoneRequest | pb.PollStopRequest | pb.WatchStepRequest
                      ) -> None:
        self.non_negative(r.step, "step")
        self.key(r.rank_id, "rank_id")

    def open_step(self, r: pb.OpenStepRequest) -> None:
        self.non_negative(r.step, "step")
        if r.pregen_window not in pb.PregenWindow.values():
            raise invalid("pregen_window", f"unknown value {r.pregen_window}")
        if not r.shards:
            raise invalid("shards", "must name at least one rank")
        seen: set[str] = set()
        for i, s in enumerate(r.shards):
            self.key(s.rank_id, f"shards[{i}].rank_id")
            if s.rank_id in seen:
                raise invalid(f"shards[{i}].rank_id", f"rank {s.rank_id!r} is listed twice")
            seen.add(s.rank_id)
            self.non_negative(s.num_requests, f"shards[{i}].num_requests")
        total = sum(len(p.samples) for p in r.next_prompts)
        self.count(total, self.c.max_tasks_per_step, "next_prompts")
        keys: set[str] = set()
        for i, p in enumerate(r.next_prompts):
            self._prompt(p, f"next_prompts[{i}]")
            if p.prompt_key in keys:
                raise invalid(f"next_prompts[{i}].prompt_key",
                              f"prompt {p.prompt_key!r} is listed twice")
            keys.add(p.prompt_key)

    def _prompt(self, p: pb.PregenPrompt, path: str) -> None:
        self.key(p.prompt_key, f"{path}.prompt_key")
        if not p.prompt_token_ids:
            raise invalid(f"{path}.prompt_token_ids", "must not be empty")
        self.tokens(p.prompt_token_ids, f"{path}.prompt_token_ids", self.c.max_prompt_tokens)
        if not 1 <= p.max_new_tokens <= self.c.max_draft_tokens:
            raise invalid(f"{path}.max_new_tokens",
                          f"must be in [1, {self.c.max_draft_tokens}], got {p.max_new_tokens}")
        sp = p.sampling
        try:  # the protocol model checks every sampling field's range
            sampling_from_pb(sp, p.max_new_tokens)
        except ValidationError as e:
            err = e.errors()[0]
            name = ".".join(str(x) for x in err["loc"])
            raise invalid(f"{path}.sampling.{name}",
                          f"{err['msg']}, got {err.get('input')!r}") from None
        for j, t in enumerate(sp.stop_token_ids):
            if t < 0:
                raise invalid(f"{path}.sampling.stop_token_ids[{j}]", f"must be >= 0, got {t}")
        if not p.samples:
            raise invalid(f"{path}.samples", "must hold at least one sample")
        indices: set[int] = set()
        for j, s in enumerate(p.samples):
            self.non_negative(s.sample_index, f"{path}.samples[{j}].sample_index")
            if s.sample_index in indices:
                raise invalid(f"{path}.samples[{j}].sample_index",
                              f"sample {s.sample_index} is listed twice")
            indices.add(s.sample_index)

    def claim(self, r: pb.ClaimTasksRequest) -> None:
        self.non_negative(r.step, "step")
        self.key(r.rank_id, "rank_id")
        if r.max_tasks < 1:
            raise invalid("max_tasks", f"must be >= 1, got {r.max_tasks}")

    def push(self, r: pb.PushDraftsRequest) -> None:
        self.non_negative(r.step, "step")
        self.key(r.rank_id, "rank_id")
        self.count(len(r.drafts), self.c.max_drafts_per_push, "drafts")
        for i, d in enumerate(r.drafts):
            path = f"drafts[{i}]"
            self.key(d.prompt_key, f"{path}.prompt_key")
            self.non_negative(d.sample_index, f"{path}.sample_index")
            self.non_negative(d.offset, f"{path}.offset")
            self.non_negative(d.weight_version, f"{path}.weight_version")
            self.tokens(d.token_ids, f"{path}.token_ids", self.c.max_draft_tokens, d.offset)

    def fetch(self, r: pb.FetchDraftsRequest) -> None:
        self.non_negative(r.step, "step")
        if not r.prompt_keys:
            raise invalid("prompt_keys", "must name at least one prompt")
        self.count(len(r.prompt_keys), self.c.max_fetch_keys, "prompt_keys")
        for i, k in enumerate(r.prompt_keys):
            self.key(k, f"prompt_keys[{i}]")

    def spans(self, r: pb.ReportSpansRequest) -> None:
        self.key(r.rank_id, "rank_id")
        self.non_negative(r.step, "step")
        self.count(len(r.spans), self.c.max_spans_per_report, "spans")
        for i, s in enumerate(r.spans):
            if s.kind not in SPAN_KIND_FROM_PB:
                raise invalid(f"spans[{i}].kind", "must be DECODE, PREGEN or IDLE")
            if not (math.isfinite(s.start_unix_s) and math.isfinite(s.end_unix_s)
                    and 0 < s.start_unix_s <= s.end_unix_s):
                raise invalid(f"spans[{i}].end_unix_s",
                              f"need 0 < start_unix_s <= end_unix_s, got {s.start_unix_s} "
                              f"and {s.end_unix_s}")
            self.non_negative(s.tokens, f"spans[{i}].tokens")
