"""Drafts served by the ranks that pushed them (the `DraftPeer` service), and the fetch that
reads them there.

At a step's start every rank fetches the drafts of its prompts. Through the synchronizer
alone that burst is one process handing out every rank's bytes (docs/results.md, "The
control plane under load"). With peers, a rank keeps a copy of each draft the synchronizer
stored from its pushes and serves it (`DraftPeerServer`); the synchronizer's FetchDrafts with
`locate` names the owner, the stored length and the weight version instead of sending the
tokens, and the reader fetches the bytes from the owners, all at once, each call with a
deadline (`fetch_located`). What an owner cannot give (gone, restarted, a shorter or other
version) the reader then fetches from the synchronizer, which still stores every draft (its
refresh hints, branch tasks, journal and restart are unchanged): a peer failure costs time,
never a draft. Drafts are proposals the engine verifies, so a wrong byte could cost
acceptance, never exactness; the reader still takes an owner's copy only at the stored
length, version and completeness.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container, Mapping, Sequence
from typing import Any

import grpc

from bubblespec.protocol.domain import DraftLocation, DraftStatus, PregenDraft
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.rpc.v1 import synchronizer_pb2_grpc as pb_grpc
from bubblespec.synchronizer import convert as cv
from bubblespec.synchronizer.store import DraftStore, slot_of

log = logging.getLogger("bubblespec.synchronizer.peer")

#: Bytes of drafts a rank keeps to serve by default (what it pushed for the coming steps).
DEFAULT_PEER_BUDGET_BYTES = 1 << 30
#: Most prompt keys one DraftPeer.FetchDrafts may name.
MAX_PEER_KEYS = 4096

Slot = tuple[str, int, int]
"""(prompt key, sample index, branch position; -1 for the draft itself)."""


def _slot(key: str, index: int, branch_at: int | None) -> Slot:
    return key, index, -1 if branch_at is None else branch_at


class PeerDrafts:
    """A rank's copies of the drafts the synchronizer stored from its pushes, per step."""

    def __init__(self, budget_bytes: int = DEFAULT_PEER_BUDGET_BYTES) -> None:
        self.store = DraftStore(budget_bytes)
        self.served_drafts = 0
        self.served_tokens = 0

    def record(self, step: int, drafts: Sequence[PregenDraft],
               statuses: Sequence[DraftStatus]) -> None:
        """Apply the pushed drafts the synchronizer STORED, as it applied them. A draft the
        local copy cannot follow (full, or a gap) is dropped here: the synchronizer then
        serves it (the reader sees it missing or short)."""
        for d, st in zip(drafts, statuses):
            if st is DraftStatus.STORED and self.store.put(step, d) is not DraftStatus.STORED:
                self.store.discard(step, d.prompt_key, slot_of(d))

    def drop_before(self, step: int) -> None:
        """Forget the drafts of steps before `step` (the synchronizer closed them)."""
        self.store.drop_through(step - 1)

    def fetch(self, step: int, prompt_keys: Sequence[str]) -> list[PregenDraft]:
        drafts, _ = self.store.fetch(step, prompt_keys)
        self.served_drafts += len(drafts)
        self.served_tokens += sum(len(d.token_ids) for d in drafts)
        return drafts


class DraftPeerService(pb_grpc.DraftPeerServicer):
    """`DraftPeer` over one rank's `PeerDrafts`. Read-only: the drafts are what this rank
    pushed, which the synchronizer accepted (every rank may fetch them there as well)."""

    def __init__(self, drafts: PeerDrafts) -> None:
        self.drafts = drafts

    async def FetchDrafts(self, r: pb.FetchDraftsRequest, context: grpc.aio.ServicerContext
                          ) -> pb.FetchDraftsResponse:
        if not r.prompt_keys or len(r.prompt_keys) > MAX_PEER_KEYS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"prompt_keys: name 1 to {MAX_PEER_KEYS} prompts")
        if r.step < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "step: must be >= 0")
        return pb.FetchDraftsResponse(drafts=[cv.draft_to_pb(d, True) for d in
                                              self.drafts.fetch(r.step, list(r.prompt_keys))])


class DraftPeerServer:
    """A gRPC server of one rank's `DraftPeer` service (TLS with `credentials`)."""

    def __init__(self, drafts: PeerDrafts, host: str = "127.0.0.1", port: int = 0,
                 advertise_host: str = "", credentials: Any = None,
                 max_message_bytes: int = 64 * 1024 * 1024) -> None:
        self.drafts, self.host, self.port = drafts, host, port
        self.advertise_host = advertise_host or host
        self.credentials, self.max_message_bytes = credentials, max_message_bytes
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        """host:port other ranks reach this server at (after `start`)."""
        return f"{self.advertise_host}:{self.port}"

    async def start(self) -> str:
        """Bind and serve; returns `address`. RuntimeError when the port is taken."""
        self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.so_reuseport", 0)])
        pb_grpc.add_DraftPeerServicer_to_server(DraftPeerService(self.drafts), self._server)
        bind = f"{self.host}:{self.port}"
        port = (self._server.add_insecure_port(bind) if self.credentials is None
                else self._server.add_secure_port(bind, self.credentials))
        if not port:
            raise RuntimeError(f"cannot bind the drafts server to {bind}")
        self.port = port
        await self._server.start()
        return self.address

    async def stop(self, grace_s: float = 0.5) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None


class PeerReader:
    """Fetches located drafts from their owners: one call per owner, all at once, each with
    a deadline; channels kept per address."""

    def __init__(self, timeout_s: float = 2.0, credentials: Any = None,
                 max_message_bytes: int = 64 * 1024 * 1024) -> None:
        self.timeout_s, self.credentials = timeout_s, credentials
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.initial_reconnect_backoff_ms", 100),
                         ("grpc.max_reconnect_backoff_ms", 1000)]
        self._stubs: dict[str, tuple[grpc.aio.Channel, pb_grpc.DraftPeerStub]] = {}
        self._warned: set[str] = set()

    def _stub(self, address: str) -> pb_grpc.DraftPeerStub:
        if address not in self._stubs:
            ch = (grpc.aio.insecure_channel(address, options=self._options)
                  if self.credentials is None
                  else grpc.aio.secure_channel(address, self.credentials,
                                               options=self._options))
            self._stubs[address] = (ch, pb_grpc.DraftPeerStub(ch))
        return self._stubs[address][1]

    async def close(self) -> None:
        for ch, _ in self._stubs.values():
            await ch.close()
        self._stubs.clear()

    async def fetch(self, step: int, located: Sequence[DraftLocation],
                    peers: Mapping[str, str], timeout_s: float | None = None,
                    local: PeerDrafts | None = None, own: Container[str] = ()
                    ) -> tuple[list[PregenDraft], list[DraftLocation]]:
        """(drafts got from their owners, locations they could not give): an owner's copy
        counts only at the stored length (its prefix, if it holds more), version and
        completeness. Drafts of the ranks in `own` are read from `local` (this process's
        copies) without a call."""
        by_owner: dict[str, list[DraftLocation]] = {}
        for x in located:
            by_owner.setdefault(x.owner, []).append(x)
        results = await asyncio.gather(*(
            self._from_owner(step, peers.get(owner, ""), xs, timeout_s,
                             local if owner in own else None)
            for owner, xs in by_owner.items()))
        got = [d for ds, _ in results for d in ds]
        missing = [x for _, xs in results for x in xs]
        return got, missing

    async def _from_owner(self, step: int, address: str, want: list[DraftLocation],
                          timeout_s: float | None, local: PeerDrafts | None
                          ) -> tuple[list[PregenDraft], list[DraftLocation]]:
        keys = list(dict.fromkeys(x.prompt_key for x in want))
        if local is not None:
            held = local.fetch(step, keys)
        elif not address:
            return [], want
        else:
            try:
                reply = await self._stub(address).FetchDrafts(
                    pb.FetchDraftsRequest(step=step, prompt_keys=keys, packed=True),
                    timeout=timeout_s or self.timeout_s)
            except grpc.aio.AioRpcError as e:
                if address not in self._warned:
                    self._warned.add(address)
                    log.warning("drafts peer %s: %s (its drafts from the synchronizer; "
                                "logged once)", address, e.code().name)
                return [], want
            held = [cv.draft_from_pb(m) for m in reply.drafts]
        have = {_slot(d.prompt_key, d.sample_index, d.branch_at): d for d in held}
        got, missing = [], []
        for x in want:
            d = have.get(_slot(x.prompt_key, x.sample_index, x.branch_at))
            if (d is None or len(d.token_ids) < x.length or d.weight_version != x.weight_version
                    or (x.complete and len(d.token_ids) != x.length)):
                missing.append(x)
                continue
            got.append(PregenDraft(x.prompt_key, x.sample_index, list(d.token_ids[:x.length]),
                                   x.complete, x.weight_version, branch_at=x.branch_at))
        return got, missing


def in_fetch_order(drafts: Sequence[PregenDraft], prompt_keys: Sequence[str]
                   ) -> list[PregenDraft]:
    """Drafts in the order FetchDrafts gives: by the asked key order, then sample index, each
    draft before its branches (by position)."""
    rank = {k: i for i, k in enumerate(dict.fromkeys(prompt_keys))}
    return sorted(drafts, key=lambda d: (rank.get(d.prompt_key, len(rank)), d.sample_index,
                                         -1 if d.branch_at is None else d.branch_at))
