"""Ranks: registration, heartbeats, LOST after the timeout, re-registration, health."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bubblespec.protocol.domain import RankState, RankStatus, SyncSnapshot
from bubblespec.synchronizer.server import SERVICE_NAME, SyncServer

from .helpers import config, eventually, serving


async def test_register_returns_intervals_and_default_poll_period() -> None:
    async with serving(heartbeat_interval_s=0.25, rank_timeout_s=1.5,
                       poll_every_decode_steps=12) as (server, client):
        reg = await client.register("r0", "http://10.0.0.1:8000", capacity=64, weight_version=3)
        assert (reg.heartbeat_interval_s, reg.rank_timeout_s) == (0.25, 1.5)
        assert reg.poll_every_decode_steps == 12
        assert reg.current_step is None and not reg.reregistered
        assert reg.instance_id == server.state.instance_id
        again = await client.register("r0", "http://10.0.0.1:8000")
        assert again.reregistered
        (info,) = (await client.get_state()).ranks
        assert (info.rank_id, info.address, info.state) == ("r0", "http://10.0.0.1:8000",
                                                            RankState.IDLE)


async def test_heartbeat_updates_rank_and_reports_step() -> None:
    async with serving() as (_, client):
        await client.register("r0", "a")
        await client.open_step(4, {"r0": 1})
        reply = await client.heartbeat("r0", RankStatus(RankState.DECODING, 7, step=4))
        assert reply.current_step == 4 and not reply.stop
        (info,) = (await client.get_state()).ranks
        assert (info.state, info.weight_version, info.step) == (RankState.DECODING, 7, 4)
        # a heartbeat's done_step counts as ReportDone (heals a lost ReportDone)
        reply = await client.heartbeat("r0", RankStatus(RankState.IDLE, 7, step=4, done_step=4))
        assert (await client.heartbeat("r0")).stop


async def test_engine_dead_is_reported_and_a_bad_status_does_not_stop_heartbeats() -> None:
    """A rank whose engine died says so (the gateway routes around it); a status that cannot
    go on the wire (a version past int64) is skipped, and the next good beat gets through."""
    async with serving(heartbeat_interval_s=0.05, rank_timeout_s=5) as (_, client):
        await client.register("r0", "a")
        statuses = iter([RankStatus(RankState.IDLE, 2**63), RankStatus(RankState.IDLE, 2**63)])
        stop = asyncio.Event()
        beating = asyncio.create_task(client.run_heartbeats(
            "r0", lambda: next(statuses, RankStatus(RankState.ENGINE_DEAD, 5)), stop))

        async def engine_dead() -> bool:
            (info,) = (await client.get_state()).ranks
            return (info.state, info.weight_version) == (RankState.ENGINE_DEAD, 5)

        await eventually(engine_dead)
        stop.set()
        await beating


async def test_silent_rank_is_lost_done_and_must_reregister() -> None:
    async with serving(heartbeat_interval_s=0.05, rank_timeout_s=0.3) as (_, client):
        await client.register("r0", "a")
        await client.register("r1", "b")
        await client.open_step(0, {"r0": 2, "r1": 2})
        stop = asyncio.Event()
        beating = asyncio.create_task(
            client.run_heartbeats("r0", lambda: RankStatus(RankState.DECODING), stop))
        await client.report_done(0, "r0")
        assert not await client.poll_stop(0, "r0")  # r1 still counts

        async def r1_lost() -> bool:
            states = {r.rank_id: r.state for r in (await client.get_state()).ranks}
            return states["r1"] is RankState.LOST

        await eventually(r1_lost)
        assert states_of(await client.get_state()) == {"r0": RankState.DECODING,
                                                       "r1": RankState.LOST}
        assert await client.poll_stop(0, "r0")  # a lost rank never blocks the stop signal
        # a lost rank's rank-scoped call re-registers transparently through the client
        await client.heartbeat("r1", RankStatus(RankState.IDLE))
        assert states_of(await client.get_state())["r1"] is RankState.IDLE
        stop.set()
        await beating


def states_of(snapshot: SyncSnapshot) -> dict[str, RankState]:
    return {r.rank_id: r.state for r in snapshot.ranks}


async def test_health_serving_then_not_serving_on_shutdown() -> None:
    server = SyncServer(config())
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE_NAME):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    stopping = asyncio.create_task(server.stop(grace_s=0.5))
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
    await stopping
    await channel.close()
