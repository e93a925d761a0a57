"""Rank-to-rank drafts (`synchronizer/peer.py`): a real daemon, real `DraftPeer` servers and
clients on loopback. The synchronizer names where a served draft is; the reader gets its
bytes from the owner and, for whatever the owner cannot give, from the synchronizer: the
same drafts, in the same order, as a fetch through the synchronizer alone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from bubblespec.protocol.domain import PregenDraft
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.rpc.v1 import synchronizer_pb2_grpc as pb_grpc
from bubblespec.synchronizer import convert as cv
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.peer import DraftPeerServer, PeerDrafts, PeerReader
from bubblespec.synchronizer.server import SyncServer
from bubblespec.synchronizer.store import DraftStore
from tests.synchronizer.helpers import config, make_tasks, serving, stub


@contextlib.asynccontextmanager
async def peer_rank(address: str, rank_id: str) -> AsyncIterator[tuple[SyncClient,
                                                                      DraftPeerServer]]:
    """A rank's synchronizer client that serves the drafts it pushes."""
    drafts = PeerDrafts()
    server = DraftPeerServer(drafts)
    await server.start()
    async with SyncClient(address, timeout_s=2.0) as c:
        c.serve_drafts(drafts, server.address, PeerReader(timeout_s=1.0))
        await c.register(rank_id, rank_id)
        try:
            yield c, server
        finally:
            await server.stop(0)


async def _open(client: SyncClient, ranks: tuple[str, ...]) -> None:
    await client.open_step(0, {r: 1 for r in (*ranks, "slow")}, make_tasks(2, 2))
    for r in ranks:
        await client.report_done(0, r)


def _push_all(rank: str) -> list[list[PregenDraft]]:
    """Chunks a rank pushes for step 1: p0's samples in two chunks (the first completes),
    a margin branch of p0/0, and p1/1 partial."""
    return [[PregenDraft("p0", 0, [5, 6, 7], offset=0),
             PregenDraft("p1", 1, [9, 9], weight_version=0)],
            [PregenDraft("p0", 0, [8, 10], complete=True, offset=3),
             PregenDraft("p0", 0, [5, 6, 11], branch_at=2)]]


def _view(ds: list[PregenDraft]) -> list[tuple]:
    return [(d.prompt_key, d.sample_index, d.branch_at, list(d.token_ids), d.complete,
             d.weight_version) for d in ds]


async def test_served_drafts_come_from_their_owner_and_equal_the_synchronizers() -> None:
    async with serving() as (server, gw):
        await gw.register("plain", "plain")
        async with peer_rank(server.address, "a") as (a, a_srv), \
                peer_rank(server.address, "b") as (b, _):
            await gw.register("slow", "slow")
            await _open(gw, ("a", "b", "plain"))
            for chunk in _push_all("a"):
                assert (await a.push_drafts(1, "a", chunk)).rejected == 0
            await gw.push_drafts(1, "plain", [PregenDraft("p1", 0, [4, 4, 4], complete=True)])
            reference = await gw.fetch_drafts(1, ["p1", "p0"])
            # the synchronizer names a's drafts instead of sending them
            ch, raw = stub(server.address)
            r = await raw.FetchDrafts(pb.FetchDraftsRequest(step=1, prompt_keys=["p0", "p1"],
                                                            locate=True), timeout=2)
            await ch.close()
            located, peers = cv.locations_from_pb(r)
            assert [(x.prompt_key, x.sample_index, x.branch_at, x.owner, x.length, x.complete)
                    for x in located] == [("p0", 0, None, "a", 5, True),
                                          ("p0", 0, 2, "a", 3, False),
                                          ("p1", 1, None, "a", 2, False)]
            assert [(d.prompt_key, d.sample_index) for d in r.drafts] == [("p1", 0)]
            assert peers == {"a": a_srv.address}
            got = await b.fetch_drafts(1, ["p1", "p0"])
            assert _view(got) == _view(reference)
            assert a.peer is not None and a.peer.served_tokens == 10


async def test_an_owner_that_is_gone_or_differs_costs_time_not_a_draft() -> None:
    async with serving() as (server, gw), peer_rank(server.address, "a") as (a, a_srv), \
            peer_rank(server.address, "b") as (b, _):
        await gw.register("slow", "slow")
        await _open(gw, ("a", "b"))
        for chunk in _push_all("a"):
            await a.push_drafts(1, "a", chunk)
        reference = _view(await gw.fetch_drafts(1, ["p0", "p1"]))
        assert a.peer is not None
        # a's copy of p1/1 lost, and a's p0/0 replaced by another version behind the
        # synchronizer's back (an injected fault): both come from the synchronizer
        a.peer.store.discard(1, "p1", (1, -1))
        a.peer.store.put(1, PregenDraft("p0", 0, [1, 2, 3, 4, 5, 6], weight_version=7))
        assert _view(await b.fetch_drafts(1, ["p0", "p1"])) == reference
        assert a.peer.served_drafts == 2  # p0/0 and its branch: p1/1 was gone
        await a_srv.stop(0)  # the owner's server is gone: all from the synchronizer
        assert _view(await b.fetch_drafts(1, ["p0", "p1"])) == reference


async def test_a_draft_extended_by_another_rank_is_served_by_the_synchronizer() -> None:
    store = DraftStore(1 << 20)

    def where(serving: set[str]) -> tuple[list[list[int]], list[str], list[list[int]]]:
        drafts, located, owners, _ = store.locate(1, ["k"], serving)
        return [list(d.token_ids) for d in drafts], owners, [list(a) for _, a in located]

    store.put(1, PregenDraft("k", 0, [1, 2]), "a")
    store.put(1, PregenDraft("k", 0, [3], offset=2), "a")
    # sample 0, the draft itself (-1), 3 tokens, not complete, version 0, owner 0 ("a")
    assert where({"a", "b"}) == ([], ["a"], [[0, -1, 3, 0, 0, 0]])
    store.put(1, PregenDraft("k", 0, [4], offset=3), "b")  # b never held k's start
    assert where({"a", "b"}) == ([[1, 2, 3, 4]], [], [])
    store.put(1, PregenDraft("k", 0, [7], complete=True, weight_version=3), "b")  # b's own
    assert where({"b"}) == ([], ["b"], [[0, -1, 1, 1, 3, 0]])
    assert where({"a"}) == ([[7]], [], [])  # b does not serve: its bytes come along


async def test_the_drafts_address_survives_a_restart_from_the_journal(tmp_path) -> None:
    journal = tmp_path / "sync.journal"
    async with SyncServer(config(journal_path=str(journal))) as server, \
            SyncClient(server.address) as c:
        c.peer_address = "10.0.0.9:7000"
        await c.register("a", "a")
        await c.register("slow", "slow")
        await _open(c, ("a",))
        await c.push_drafts(1, "a", [PregenDraft("p0", 1, [3, 4], complete=True)])
    async with SyncServer(config(journal_path=str(journal))) as server:
        ch, raw = stub(server.address)
        r = await raw.FetchDrafts(pb.FetchDraftsRequest(step=1, prompt_keys=["p0"],
                                                        locate=True), timeout=2)
        await ch.close()
        located, peers = cv.locations_from_pb(r)
        assert [(x.owner, x.length, x.complete) for x in located] == [("a", 2, True)]
        assert peers == {"a": "10.0.0.9:7000"}


async def test_bad_requests_name_their_field() -> None:
    async with serving() as (server, _):
        ch, raw = stub(server.address)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw.RegisterRank(pb.RegisterRankRequest(rank_id="a", address="a",
                                                          drafts_address="x" * 5000), timeout=2)
        await ch.close()
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "drafts_address" in (e.value.details() or "")
    peer = DraftPeerServer(PeerDrafts())
    await peer.start()
    ch = grpc.aio.insecure_channel(peer.address)
    try:
        for req, field in ((pb.FetchDraftsRequest(step=1), "prompt_keys"),
                           (pb.FetchDraftsRequest(step=-1, prompt_keys=["k"]), "step")):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pb_grpc.DraftPeerStub(ch).FetchDrafts(req, timeout=2)
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert field in (e.value.details() or "")
    finally:
        await ch.close()
        await peer.stop(0)
