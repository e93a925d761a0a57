"""Field-level validation of every request, before it touches the state.

Each check raises INVALID_ARGUMENT naming the field's path (`drafts[3].token_ids[17]`), so a
caller can find its bug without reading the daemon's logs. Sizes come from `SyncConfig`; the
ranges of steps, versions, seeds and sample indices are the protocol's
(`bubblespec.protocol.limits`), the same numbers the HTTP bodies declare, so that nothing
out of range is stored (a stored step of 2**63 - 1 would make every later step overflow).

Token ids are checked against the vocabulary: the smallest of the `vocab_size` setting and
the vocabularies the ranks not LOST reported when they registered. Every rank may fetch a pushed draft or claim a
pre-generation task, so one id outside the smallest vocabulary would reach an engine that
cannot embed it. With neither known, ids are only checked to be >= 0.
Checks that depend on the state (unknown rank, step not open) live in `state.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import ValidationError

from bubblespec.protocol import limits as L
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.synchronizer.config import SyncConfig
from bubblespec.synchronizer.convert import (
    RANK_STATE_FROM_PB,
    SPAN_KIND_FROM_PB,
    sampling_from_pb,
)
from bubblespec.synchronizer.errors import invalid


class Validator:
    """Validates requests against the configured limits and the ranks' vocabulary."""

    def __init__(self, config: SyncConfig, is_lost: Callable[[str], bool] = lambda _r: False
                 ) -> None:
        self.c = config
        self._is_lost = is_lost
        self._vocab_by_rank: dict[str, int] = {}

    def learn_vocab(self, rank_id: str, vocab_size: int) -> None:
        """Record the vocabulary a rank reported at registration (0: not told)."""
        if vocab_size > 0:
            self._vocab_by_rank[rank_id] = vocab_size
        else:
            self._vocab_by_rank.pop(rank_id, None)

    @property
    def vocab_size(self) -> int | None:
        """Token ids must be below this: the setting, and the vocabulary of every rank not
        LOST (a rank that went away, or a client that registered a rank and never
        heartbeats, stops narrowing it); None when neither is known."""
        sizes = [v for r, v in self._vocab_by_rank.items() if not self._is_lost(r)]
        if self.c.vocab_size:
            sizes.append(self.c.vocab_size)
        return min(sizes) if sizes else None

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

    @staticmethod
    def in_range(value: int, path: str, hi: int, lo: int = 0) -> None:
        """lo <= value <= hi."""
        if not lo <= value <= hi:
            raise invalid(path, f"must be in [{lo}, {hi}], got {value}")

    def step(self, value: int, path: str = "step") -> None:
        self.in_range(value, path, L.MAX_STEP)

    def version(self, value: int, path: str = "weight_version") -> None:
        self.in_range(value, path, L.MAX_WEIGHT_VERSION)

    def tokens(self, ids: Sequence[int], path: str, limit: int, offset: int = 0) -> None:
        """Token ids in [0, vocabulary) and at most `limit` of them (counting `offset`
        earlier ones)."""
        if offset + len(ids) > limit:
            raise invalid(path, f"{offset + len(ids)} tokens exceed the limit of {limit}")
        if len(ids) == 0:
            return
        vocab = self.vocab_size
        if isinstance(ids, np.ndarray):  # a packed draft's: checked at numpy speed
            fine = self.ids_in_vocab(ids)
        else:
            fine = min(ids) >= 0 and (vocab is None or max(ids) < vocab)
        if not fine:
            bound = "" if vocab is None else f", {vocab}"
            i = next(i for i, t in enumerate(ids) if t < 0 or (vocab is not None and t >= vocab))
            raise invalid(f"{path}[{i}]", f"token id {ids[i]} outside [0{bound})")

    def count(self, n: int, limit: int, path: str) -> None:
        if n > limit:
            raise invalid(path, f"{n} entries exceed the limit of {limit}")

    # ------------------------------------------------------------------ requests

    def register(self, r: pb.RegisterRankRequest) -> None:
        self.key(r.rank_id, "rank_id")
        if len(r.address.encode()) > self.c.max_key_bytes:
            raise invalid("address", f"longer than {self.c.max_key_bytes} bytes")
        if len(r.drafts_address.encode()) > self.c.max_key_bytes:
            raise invalid("drafts_address", f"longer than {self.c.max_key_bytes} bytes")
        if r.HasField("capacity") and r.capacity < 1:
            raise invalid("capacity", f"must be >= 1 when set, got {r.capacity}")
        self.version(r.weight_version)
        self.non_negative(r.vocab_size, "vocab_size")

    def heartbeat(self, r: pb.HeartbeatRequest) -> None:
        self.key(r.rank_id, "rank_id")
        if r.state not in RANK_STATE_FROM_PB or r.state == pb.RANK_STATE_LOST:
            raise invalid("state", f"{r.state} is not a state a rank can report")
        self.version(r.weight_version)
        for name in ("step", "done_step"):
            if r.HasField(name):
                self.step(getattr(r, name), name)

    def step_and_rank(self, r: pb.ReportDoneRequest | pb.PollStopRequest | pb.WatchStepRequest
                      ) -> None:
        self.step(r.step)
        self.key(r.rank_id, "rank_id")

    def open_step(self, r: pb.OpenStepRequest) -> None:
        self.step(r.step)
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
        self.non_negative(r.weight_version, "weight_version")
        last = r.step + self.c.max_lookahead_steps
        per_step: dict[int, int] = {}
        keys: set[tuple[int, str]] = set()
        for i, p in enumerate(r.next_prompts):
            target = p.step or r.step + 1
            if not r.step < target <= last:
                raise invalid(f"next_prompts[{i}].step",
                              f"must be in [{r.step + 1}, {last}] (step + 1 .. step + "
                              f"max_lookahead_steps), got {p.step}")
            per_step[target] = per_step.get(target, 0) + len(p.samples)
            self._prompt(p, f"next_prompts[{i}]")
            if (target, p.prompt_key) in keys:
                raise invalid(f"next_prompts[{i}].prompt_key",
                              f"prompt {p.prompt_key!r} is listed twice for step {target}")
            keys.add((target, p.prompt_key))
        for target, total in per_step.items():
            self.count(total, self.c.max_tasks_per_step, "next_prompts")

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
            name = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err["loc"])
            raise invalid(f"{path}.sampling{name}",
                          f"{err['msg']}, got {err.get('input')!r}") from None
        self.tokens(sp.stop_token_ids, f"{path}.sampling.stop_token_ids", L.MAX_STOP_TOKEN_IDS)
        self.tokens(sorted(sp.logit_bias), f"{path}.sampling.logit_bias",
                    L.MAX_LOGIT_BIAS_ENTRIES)
        self.tokens(sp.allowed_token_ids, f"{path}.sampling.allowed_token_ids",
                    L.MAX_LOGIT_BIAS_ENTRIES)
        if not p.samples:
            raise invalid(f"{path}.samples", "must hold at least one sample")
        indices: set[int] = set()
        for j, s in enumerate(p.samples):
            self.in_range(s.sample_index, f"{path}.samples[{j}].sample_index",
                          L.MAX_SAMPLE_INDEX)
            self.in_range(s.seed, f"{path}.samples[{j}].seed", L.MAX_SEED)
            if s.sample_index in indices:
                raise invalid(f"{path}.samples[{j}].sample_index",
                              f"sample {s.sample_index} is listed twice")
            indices.add(s.sample_index)

    def claim(self, r: pb.ClaimTasksRequest) -> None:
        self.step(r.step)
        self.key(r.rank_id, "rank_id")
        if r.max_tasks < 1:
            raise invalid("max_tasks", f"must be >= 1, got {r.max_tasks}")

    def push(self, r: pb.PushDraftsRequest) -> None:
        """Every field of every draft; the packed drafts' token ids are range-checked in one
        pass over the request (a push carries many short chunks: one numpy pass each cost
        more than the rest of their checks), and only a request with an id out of range is
        searched for the first one, which the error names."""
        self.step(r.step)
        self.key(r.rank_id, "rank_id")
        self.count(len(r.drafts), self.c.max_drafts_per_push, "drafts")
        limit = self.c.max_draft_tokens
        packed: list[bytes] = []
        for i, d in enumerate(r.drafts):
            path = f"drafts[{i}]"
            self.key(d.prompt_key, f"{path}.prompt_key")
            self.in_range(d.sample_index, f"{path}.sample_index", L.MAX_SAMPLE_INDEX)
            self.non_negative(d.offset, f"{path}.offset")
            self.version(d.weight_version, f"{path}.weight_version")
            ids = self.draft_ids(d, path)
            if isinstance(ids, np.ndarray):  # the count here, the ids after the loop
                if d.offset + len(ids) > limit:
                    raise invalid(f"{path}.token_ids", f"{d.offset + len(ids)} tokens exceed "
                                  f"the limit of {limit}")
                packed.append(d.token_ids_packed)
            else:
                self.tokens(ids, f"{path}.token_ids", limit, d.offset)
            if d.HasField("branch_at"):  # the runner-up token is one of its tokens
                self.in_range(d.branch_at, f"{path}.branch_at", d.offset + len(ids) - 1)
            self.offers(d, path, ids)
            self.records(d, path, d.offset + len(ids))
        if packed and not self.ids_in_vocab(np.frombuffer(b"".join(packed), dtype="<i4")):
            for i, d in enumerate(r.drafts):
                if d.token_ids_packed:
                    self.tokens(np.frombuffer(d.token_ids_packed, dtype="<i4"),
                                f"drafts[{i}].token_ids", limit, d.offset)

    def ids_in_vocab(self, ids: np.ndarray) -> bool:
        """Every id of `ids` in [0, vocabulary)."""
        if not len(ids):
            return True
        vocab = self.vocab_size
        return int(ids.min()) >= 0 and (vocab is None or int(ids.max()) < vocab)

    @staticmethod
    def draft_ids(d: pb.Draft, path: str) -> Sequence[int]:
        """The draft's token ids from one of its two fields, read in place (the packed bytes
        as a numpy view: the conversion happens once, in `convert.draft_tokens`)."""
        if not d.token_ids_packed:
            return d.token_ids
        if d.token_ids:
            raise invalid(f"{path}.token_ids_packed",
                          "set token_ids or token_ids_packed, not both")
        if len(d.token_ids_packed) % 4:
            raise invalid(f"{path}.token_ids_packed",
                          f"{len(d.token_ids_packed)} bytes: not whole int32 values "
                          "(4 bytes each, little-endian)")
        return np.frombuffer(d.token_ids_packed, dtype="<i4")

    def records(self, d: pb.Draft, path: str, n: int) -> None:
        """Margin records: a draft's (not a branch's) running minima, at its positions in
        ascending order, finite, non-negative and strictly falling."""
        if not d.margin_records:
            return
        path = f"{path}.margin_records"
        if d.HasField("branch_at"):
            raise invalid(path, "a branch has no margin records")
        self.count(len(d.margin_records), n, path)
        prev_at, prev_m = -1, math.inf
        for j, rec in enumerate(d.margin_records):
            self.in_range(rec.at, f"{path}[{j}].at", n - 1, prev_at + 1)
            if not (math.isfinite(rec.margin) and 0 <= rec.margin < prev_m):
                raise invalid(f"{path}[{j}].margin", "must be finite, >= 0 and below the "
                              f"previous record's, got {rec.margin}")
            prev_at, prev_m = rec.at, rec.margin

    def report_done(self, r: pb.ReportDoneRequest) -> None:
        """Step and rank; each flip names a prompt key, a sample index and a position."""
        self.step_and_rank(r)
        self.count(len(r.flips), L.MAX_FLIPS, "flips")
        for i, f in enumerate(r.flips):
            self.key(f.prompt_key, f"flips[{i}].prompt_key")
            self.in_range(f.sample_index, f"flips[{i}].sample_index", L.MAX_SAMPLE_INDEX)
            self.in_range(f.at, f"flips[{i}].at", self.c.max_draft_tokens)

    def offers(self, d: pb.Draft, path: str, ids: Sequence[int]) -> None:
        """Branch offers: only on a draft that is not itself a branch (complete, or partial
        while it decodes: streamed offers), each at a position of the draft with a token id
        of the vocabulary other than the draft's."""
        if not d.branch_offers:
            return
        path = f"{path}.branch_offers"
        if d.HasField("branch_at"):
            raise invalid(path, "a branch offers no branches")
        self.count(len(d.branch_offers), L.MAX_BRANCH_OFFERS, path)
        n = d.offset + len(ids)
        seen: set[int] = set()
        for j, o in enumerate(d.branch_offers):
            self.in_range(o.at, f"{path}[{j}].at", n - 1)
            vocab = self.vocab_size
            self.in_range(o.token_id, f"{path}[{j}].token_id",
                          L.MAX_TOKEN_ID if vocab is None else vocab - 1)
            if o.at in seen:
                raise invalid(f"{path}[{j}].at", f"position {o.at} is offered twice")
            seen.add(o.at)
            if o.at >= d.offset and ids[o.at - d.offset] == o.token_id:
                raise invalid(f"{path}[{j}].token_id",
                              f"{o.token_id} is the draft's own token at {o.at}")

    def fetch(self, r: pb.FetchDraftsRequest) -> None:
        self.step(r.step)
        if not r.prompt_keys:
            raise invalid("prompt_keys", "must name at least one prompt")
        self.count(len(r.prompt_keys), self.c.max_fetch_keys, "prompt_keys")
        for i, k in enumerate(r.prompt_keys):
            self.key(k, f"prompt_keys[{i}]")

    def spans(self, r: pb.ReportSpansRequest) -> None:
        self.key(r.rank_id, "rank_id")
        self.step(r.step)
        self.count(len(r.spans), self.c.max_spans_per_report, "spans")
        for i, s in enumerate(r.spans):
            if s.kind not in SPAN_KIND_FROM_PB:
                raise invalid(f"spans[{i}].kind", "must be DECODE, PREGEN or IDLE")
            if not (math.isfinite(s.start_unix_s) and math.isfinite(s.end_unix_s)
                    and 0 < s.start_unix_s <= s.end_unix_s):
                raise invalid(f"spans[{i}].end_unix_s",
                              f"need 0 < start_unix_s <= end_unix_s, got {s.start_unix_s} "
                              f"and {s.end_unix_s}")
            self.in_range(s.tokens, f"spans[{i}].tokens", L.MAX_SPAN_TOKENS)
