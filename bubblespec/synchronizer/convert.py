"""The one mapping between `bubblespec.rpc.v1` messages and the protocol's types.

Used by the daemon (requests in, replies out) and by `SyncClient` (the reverse), so both ends
agree by construction. Unset `optional` proto fields become None (or the documented default).
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Iterable, Sequence

from bubblespec.protocol.domain import (
    DraftLocation,
    DraftStatus,
    Flip,
    PregenDraft,
    PregenTask,
    RankInfo,
    RankState,
    ShardAssignment,
    Span,
    SpanKind,
    StepEvent,
    StepEventKind,
    StepTimeline,
    StoreStats,
    SyncSnapshot,
)
from bubblespec.protocol.sampling import PregenWindow, SamplingParams
from bubblespec.rpc.v1 import synchronizer_pb2 as pb

RANK_STATE_TO_PB = {
    RankState.UNSPECIFIED: pb.RANK_STATE_UNSPECIFIED,
    RankState.IDLE: pb.RANK_STATE_IDLE,
    RankState.DECODING: pb.RANK_STATE_DECODING,
    RankState.PREGEN: pb.RANK_STATE_PREGEN,
    RankState.UPDATING_WEIGHTS: pb.RANK_STATE_UPDATING_WEIGHTS,
    RankState.LOST: pb.RANK_STATE_LOST,
    RankState.ENGINE_DEAD: pb.RANK_STATE_ENGINE_DEAD,
    RankState.RELEASED: pb.RANK_STATE_RELEASED,
    RankState.STARTING: pb.RANK_STATE_STARTING,
}
RANK_STATE_FROM_PB = {v: k for k, v in RANK_STATE_TO_PB.items()}
SPAN_KIND_TO_PB = {
    SpanKind.DECODE: pb.SPAN_KIND_DECODE,
    SpanKind.PREGEN: pb.SPAN_KIND_PREGEN,
    SpanKind.IDLE: pb.SPAN_KIND_IDLE,
    SpanKind.PREGEN_WINDOW: pb.SPAN_KIND_PREGEN_WINDOW,
    SpanKind.PREGEN_TAIL: pb.SPAN_KIND_PREGEN_TAIL,
}
SPAN_KIND_FROM_PB = {v: k for k, v in SPAN_KIND_TO_PB.items()}
PREGEN_WINDOW_TO_PB = {
    PregenWindow.BUBBLE: pb.PREGEN_WINDOW_BUBBLE,
    PregenWindow.TRAINING: pb.PREGEN_WINDOW_TRAINING,
}
PREGEN_WINDOW_FROM_PB = {**{v: k for k, v in PREGEN_WINDOW_TO_PB.items()},
                         pb.PREGEN_WINDOW_UNSPECIFIED: PregenWindow.BUBBLE}
EVENT_KIND_TO_PB = {
    StepEventKind.OPENED: pb.STEP_EVENT_KIND_OPENED,
    StepEventKind.STOP: pb.STEP_EVENT_KIND_STOP,
    StepEventKind.CLOSED: pb.STEP_EVENT_KIND_CLOSED,
}
EVENT_KIND_FROM_PB = {v: k for k, v in EVENT_KIND_TO_PB.items()}
DRAFT_STATUS_TO_PB = {
    DraftStatus.STORED: pb.DRAFT_STATUS_STORED,
    DraftStatus.REJECTED_FULL: pb.DRAFT_STATUS_REJECTED_FULL,
    DraftStatus.REJECTED_STEP: pb.DRAFT_STATUS_REJECTED_STEP,
    DraftStatus.REJECTED_GAP: pb.DRAFT_STATUS_REJECTED_GAP,
}
DRAFT_STATUS_FROM_PB = {v: k for k, v in DRAFT_STATUS_TO_PB.items()}


def _opt(msg, name: str):
    return getattr(msg, name) if msg.HasField(name) else None


_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed_mode", "ignore_eos",
                    "repetition_penalty", "presence_penalty", "frequency_penalty",
                    "min_tokens", "min_p")
"""Fields of `SamplingParams` carried as `optional` scalars of `pb.SamplingParams` (the
response budget, `max_new_tokens`, travels on the task or prompt message; the stop ids and
the logit bias are a list and a map of their own)."""


def sampling_to_pb(s: SamplingParams) -> pb.SamplingParams:
    wire = {f: getattr(s, f) for f in _SAMPLING_FIELDS}
    return pb.SamplingParams(**{**wire, "seed_mode": s.seed_mode.value},
                             stop_token_ids=list(s.stop_token_ids),
                             logit_bias=dict(s.logit_bias),
                             allowed_token_ids=list(s.allowed_token_ids),
                             bad_words=list(s.bad_words),
                             structured=None if s.structured is None
                             else s.structured.model_dump_json(exclude_defaults=True))


def sampling_from_pb(m: pb.SamplingParams, max_new_tokens: int) -> SamplingParams:
    """Unset fields take the defaults (temperature 1, top_p 1, top_k off)."""
    given = {f: getattr(m, f) for f in _SAMPLING_FIELDS if m.HasField(f)}
    if m.HasField("structured"):  # JSON text; what is not JSON is named by the model
        given["structured"] = _json_or_text(m.structured)
    return SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=tuple(m.stop_token_ids),
                          logit_bias=dict(m.logit_bias),
                          allowed_token_ids=tuple(m.allowed_token_ids),
                          bad_words=tuple(m.bad_words), **given)


def _json_or_text(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def task_to_pb(t: PregenTask) -> pb.PregenTask:
    return pb.PregenTask(
        prompt_key=t.prompt_key, prompt_token_ids=t.prompt_token_ids,
        sample_index=t.sample_index, seed=t.seed, max_new_tokens=t.max_new_tokens,
        sampling=sampling_to_pb(t.sampling), prefix_token_ids=t.prefix,
        branch_at=t.branch_at, step=t.step or 0, hint_token_ids=t.hint,
    )


def task_from_pb(m: pb.PregenTask) -> PregenTask:
    return PregenTask(m.prompt_key, list(m.prompt_token_ids), m.sample_index, m.seed,
                      sampling_from_pb(m.sampling, m.max_new_tokens),
                      list(m.prefix_token_ids) or (),
                      m.branch_at if m.HasField("branch_at") else None,
                      m.step or None, list(m.hint_token_ids) or ())


def tasks_to_prompts(tasks: Sequence[PregenTask]) -> list[pb.PregenPrompt]:
    """Group flat tasks by (step, prompt) (first-seen order) so each prompt's tokens travel
    once per step.

    Raises ValueError when two tasks of one prompt_key and step disagree on tokens or
    parameters.
    """
    prompts: dict[tuple[int, str], tuple[PregenTask, pb.PregenPrompt]] = {}
    for i, t in enumerate(tasks):
        entry = prompts.get((t.step or 0, t.prompt_key))
        if entry is None:
            msg = pb.PregenPrompt(
                prompt_key=t.prompt_key, prompt_token_ids=t.prompt_token_ids,
                max_new_tokens=t.max_new_tokens, sampling=sampling_to_pb(t.sampling),
                step=t.step or 0)
            entry = prompts[t.step or 0, t.prompt_key] = (t, msg)
        first, msg = entry
        if (list(first.prompt_token_ids) != list(t.prompt_token_ids)
                or first.sampling != t.sampling):
            raise ValueError(f"tasks[{i}]: prompt_key {t.prompt_key!r} has different prompt "
                             "tokens, max_new_tokens or sampling than an earlier task")
        msg.samples.add(sample_index=t.sample_index, seed=t.seed)
    return [msg for _, msg in prompts.values()]


def prompts_to_tasks(prompts: Iterable[pb.PregenPrompt], opened: int) -> list[PregenTask]:
    """Flatten prompts into tasks, each naming its step (unset: `opened` + 1); the samples
    of a prompt share one token array."""
    out = []
    for p in prompts:
        tokens = array("i", p.prompt_token_ids)
        sampling = sampling_from_pb(p.sampling, p.max_new_tokens)
        step = p.step or opened + 1
        for s in p.samples:
            out.append(PregenTask(p.prompt_key, tokens, s.sample_index, s.seed, sampling,
                                  step=step))
    return out


def shard_from_pb(m: pb.ShardAssignment) -> ShardAssignment:
    return ShardAssignment(m.rank_id, m.num_requests)


def shard_to_pb(s: ShardAssignment) -> pb.ShardAssignment:
    return pb.ShardAssignment(rank_id=s.rank_id, num_requests=s.num_requests)


def pack_tokens(ids: Sequence[int]) -> bytes:
    """Token ids as `Draft.token_ids_packed`: int32 little-endian (a copy of an
    `array('i')`'s buffer, where the repeated field converts token by token)."""
    a = ids if isinstance(ids, array) and ids.typecode == "i" else array("i", ids)
    if sys.byteorder == "big":
        a = array("i", a)
        a.byteswap()
    return a.tobytes()


def draft_tokens(m: pb.Draft) -> array:
    """A Draft's token ids as `array('i')`: the packed field when set, else the repeated one.
    The packed length must be a multiple of 4 (the validator says so first)."""
    if m.token_ids_packed:
        a = array("i")
        a.frombytes(m.token_ids_packed)
        if sys.byteorder == "big":
            a.byteswap()
        return a
    return array("i", m.token_ids)


def draft_to_pb(d: PregenDraft, packed: bool = True) -> pb.Draft:
    """`packed`: tokens in `token_ids_packed` (else in the repeated `token_ids`)."""
    tokens = ({"token_ids_packed": pack_tokens(d.token_ids)} if packed
              else {"token_ids": d.token_ids})
    return pb.Draft(prompt_key=d.prompt_key, sample_index=d.sample_index, **tokens,
                    complete=d.complete,
                    weight_version=d.weight_version, offset=d.offset, branch_at=d.branch_at,
                    branch_offers=[pb.BranchOffer(at=a, token_id=t) for a, t in d.branch_offers],
                    margin_records=[pb.MarginRecord(at=a, margin=m)
                                    for a, m in d.margin_records])


def located_to_pb(prompt_key: str, where: array) -> pb.LocatedDrafts:
    """One prompt key's located drafts (`DraftStore.locate`'s six int64 per draft)."""
    if sys.byteorder == "big":
        where = array("q", where)
        where.byteswap()
    return pb.LocatedDrafts(prompt_key=prompt_key, packed=where.tobytes())


def locations_from_pb(r: pb.FetchDraftsResponse) -> tuple[list[DraftLocation], dict[str, str]]:
    """The drafts a FetchDrafts with `locate` located, and owner -> drafts address."""
    owners = list(r.owners)
    out: list[DraftLocation] = []
    for m in r.located:
        a = array("q")
        a.frombytes(m.packed)
        if sys.byteorder == "big":
            a.byteswap()
        for j in range(0, len(a) - 5, 6):
            index, at, length, complete, version, owner = a[j : j + 6]
            out.append(DraftLocation(m.prompt_key, index, length, bool(complete), version,
                                     owners[owner], None if at < 0 else at))
    return out, dict(zip(owners, r.owner_addresses))


def draft_from_pb(m: pb.Draft, lists: bool = False) -> PregenDraft:
    """`lists`: token ids as a list (for callers); else the `array('i')` the store keeps."""
    ids = draft_tokens(m)
    return PregenDraft(m.prompt_key, m.sample_index, ids.tolist() if lists else ids, m.complete,
                       m.weight_version, m.offset,
                       m.branch_at if m.HasField("branch_at") else None,
                       [(o.at, o.token_id) for o in m.branch_offers] or (),
                       [(r.at, r.margin) for r in m.margin_records] or ())


def flip_to_pb(f: Flip) -> pb.Flip:
    return pb.Flip(prompt_key=f.prompt_key, sample_index=f.sample_index, at=f.at)


def flip_from_pb(m: pb.Flip) -> Flip:
    return Flip(m.prompt_key, m.sample_index, m.at)


def span_to_pb(s: Span) -> pb.Span:
    return pb.Span(kind=SPAN_KIND_TO_PB[s.kind], start_unix_s=s.start_unix_s,
                   end_unix_s=s.end_unix_s, tokens=s.tokens)


def span_from_pb(m: pb.Span) -> Span:
    return Span(SPAN_KIND_FROM_PB[m.kind], m.start_unix_s, m.end_unix_s, m.tokens)


def event_to_pb(e: StepEvent) -> pb.StepEvent:
    return pb.StepEvent(kind=EVENT_KIND_TO_PB[e.kind], step=e.step, unix_s=e.unix_s)


def event_from_pb(m: pb.StepEvent) -> StepEvent:
    return StepEvent(EVENT_KIND_FROM_PB[m.kind], m.step, m.unix_s)


def rank_info_to_pb(r: RankInfo) -> pb.RankInfo:
    return pb.RankInfo(rank_id=r.rank_id, address=r.address, capacity=r.capacity,
                       state=RANK_STATE_TO_PB[r.state], weight_version=r.weight_version,
                       step=r.step, done_step=r.done_step,
                       last_heartbeat_age_s=r.last_heartbeat_age_s)


def rank_info_from_pb(m: pb.RankInfo) -> RankInfo:
    return RankInfo(m.rank_id, m.address, _opt(m, "capacity"), RANK_STATE_FROM_PB[m.state],
                    m.weight_version, _opt(m, "step"), _opt(m, "done_step"),
                    m.last_heartbeat_age_s)


def snapshot_to_pb(s: SyncSnapshot) -> pb.GetStateResponse:
    return pb.GetStateResponse(
        instance_id=s.instance_id, current_step=s.current_step, step_open=s.step_open,
        stopped=s.stopped, ranks=[rank_info_to_pb(r) for r in s.ranks],
        done_rank_ids=s.done_rank_ids, pending_rank_ids=s.pending_rank_ids,
        queued_tasks=s.queued_tasks, claimed_tasks=s.claimed_tasks,
        store=pb.DraftStoreStats(sequences=s.store.sequences, tokens=s.store.tokens,
                                 bytes=s.store.bytes, budget_bytes=s.store.budget_bytes),
    )


def snapshot_from_pb(m: pb.GetStateResponse) -> SyncSnapshot:
    st = m.store
    return SyncSnapshot(
        m.instance_id, _opt(m, "current_step"), m.step_open, m.stopped,
        [rank_info_from_pb(r) for r in m.ranks], list(m.done_rank_ids),
        list(m.pending_rank_ids), m.queued_tasks, m.claimed_tasks,
        StoreStats(st.sequences, st.tokens, st.bytes, st.budget_bytes),
    )


def timeline_to_pb(t: StepTimeline) -> pb.StepTimeline:
    ranks = sorted(set(t.spans) | set(t.done_unix_s))
    return pb.StepTimeline(
        step=t.step, opened_unix_s=t.opened_unix_s, stop_unix_s=t.stop_unix_s,
        closed_unix_s=t.closed_unix_s, shards=[shard_to_pb(s) for s in t.shards],
        ranks=[pb.RankTimeline(rank_id=r, spans=[span_to_pb(s) for s in t.spans.get(r, [])],
                               done_unix_s=t.done_unix_s.get(r)) for r in ranks],
    )


def timeline_from_pb(m: pb.StepTimeline) -> StepTimeline:
    return StepTimeline(
        step=m.step, opened_unix_s=m.opened_unix_s, stop_unix_s=_opt(m, "stop_unix_s"),
        closed_unix_s=_opt(m, "closed_unix_s"), shards=[shard_from_pb(s) for s in m.shards],
        spans={r.rank_id: [span_from_pb(s) for s in r.spans] for r in m.ranks},
        done_unix_s={r.rank_id: r.done_unix_s for r in m.ranks if r.HasField("done_unix_s")},
    )
