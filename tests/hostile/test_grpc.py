"""Property-based hostile input over every method of the synchronizer's gRPC service.

Requests are generated from the protobuf descriptors (every field of every message, nested
ones included): int32/int64/uint64 extremes, NaN and infinities, long and odd strings,
unknown enum values, empty and long repeated fields, biased towards the ids a live daemon
knows (`r0`, step 0 and 1) so that many requests get past the first checks. The daemon is
a real process (`python -m bubblespec.synchronizer.server`) with a bearer token. No answer
may be INTERNAL or UNKNOWN, and afterwards the daemon still runs a normal step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.rpc.v1 import synchronizer_pb2_grpc as pb_grpc
from tests.synchronizer.helpers import Daemon

TOKEN = "grpc-hostile-token"
META = (("authorization", f"Bearer {TOKEN}"),)
SERVICE = pb.DESCRIPTOR.services_by_name["Synchronizer"]
BAD_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)

F = FieldDescriptor
INTS: dict[int, list[int]] = {
    F.TYPE_INT32: [0, 1, 2, -1, 999, 1000, 2**31 - 1, -(2**31)],
    F.TYPE_INT64: [0, 1, 2, -1, 2**53, 2**62, 2**63 - 1, -(2**63)],
    F.TYPE_UINT64: [0, 1, 2**63 - 1, 2**63, 2**64 - 1],
    F.TYPE_UINT32: [0, 1, 2**32 - 1],
}
DOUBLES = [0.0, 1.0, -1.0, 0.5, 1.7e9, 2.0000001, float("nan"), float("inf"), float("-inf"),
           1e308, 5e-324]
STRINGS = ["r0", "p", "", "x" * 5000, "\u0000", "ü" * 300, "default", "keyed", "ghost"]
# bytes (packed token ids): whole and torn int32s, ids in and out of any vocabulary, huge
BYTES = [b"", b"\x05\x00\x00\x00", b"\x05\x00\x00", b"\xff\xff\xff\xff",
         b"\xff\xff\xff\x7f" * 3, b"\x01\x00\x00\x00" * 70_000, b"\x00" * 4097]


def field_values(f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if f.type == F.TYPE_MESSAGE:
        return messages(f.message_type, depth + 1)
    if f.type in INTS:
        return st.sampled_from(INTS[f.type])
    if f.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.sampled_from(DOUBLES)
    if f.type == F.TYPE_BOOL:
        return st.booleans()
    if f.type == F.TYPE_ENUM:
        return st.sampled_from([v.number for v in f.enum_type.values] + [99, -1])
    if f.type == F.TYPE_STRING:
        return st.sampled_from(STRINGS)
    if f.type == F.TYPE_BYTES:
        return st.sampled_from(BYTES)
    raise AssertionError(f"field type {f.type} of {f.full_name} has no strategy")


def _is_map(f: FieldDescriptor) -> bool:
    return f.type == F.TYPE_MESSAGE and f.message_type.GetOptions().map_entry


def messages(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of type `desc` with any subset of their fields set to hostile values."""
    cls = GetMessageClass(desc)
    if depth > 3:
        return st.just(cls())
    fields: dict[str, st.SearchStrategy[Any]] = {}
    maps = {f.name for f in desc.fields if _is_map(f)}
    for f in desc.fields:
        if f.name in maps:  # a map: hostile keys and values
            entry = f.message_type
            fields[f.name] = st.dictionaries(field_values(entry.fields_by_name["key"], depth),
                                             field_values(entry.fields_by_name["value"], depth),
                                             max_size=3)
            continue
        one = field_values(f, depth)
        if f.is_repeated:
            many = st.lists(one, max_size=3)
            if f.type == F.TYPE_INT32:  # token ids: also a long run of one value
                many = many | st.sampled_from([[1] * 100_000, [999] * 10, [1000] * 3])
            fields[f.name] = many
        else:
            fields[f.name] = one

    def build(values: dict[str, Any]) -> Message:
        m = cls()
        for name, v in values.items():
            fd = desc.fields_by_name[name]
            if name in maps:
                getattr(m, name).update(v)
            elif fd.is_repeated:
                getattr(m, name).extend(v)
            elif fd.type == F.TYPE_MESSAGE:
                getattr(m, name).CopyFrom(v)
            else:
                setattr(m, name, v)
        return m

    return st.fixed_dictionaries({}, optional=fields).map(build)


def call(stub: pb_grpc.SynchronizerStub, method: str, request: Message) -> grpc.StatusCode:
    """The status code of one call (OK, or the error's); streams read their first event."""
    rpc = getattr(stub, method)
    try:
        if SERVICE.methods_by_name[method].server_streaming:
            stream = rpc(request, metadata=META, timeout=0.5)
            next(iter(stream), None)
        else:
            rpc(request, metadata=META, timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def normal_step(stub: pb_grpc.SynchronizerStub, step: int) -> None:
    """Register, open `step` with one pre-generation task, claim, push, fetch, report done."""
    stub.RegisterRank(pb.RegisterRankRequest(rank_id="r0", address="a", vocab_size=1000),
                      metadata=META, timeout=5)
    p = pb.PregenPrompt(prompt_key="p", prompt_token_ids=[1, 2], max_new_tokens=4,
                        samples=[pb.PregenSample(sample_index=0, seed=1)])
    stub.OpenStep(pb.OpenStepRequest(step=step, shards=[pb.ShardAssignment(
        rank_id="r0", num_requests=1)], next_prompts=[p],
        pregen_window=pb.PREGEN_WINDOW_TRAINING), metadata=META, timeout=5)
    stub.ReportDone(pb.ReportDoneRequest(step=step, rank_id="r0"), metadata=META, timeout=5)
    claim = stub.ClaimTasks(pb.ClaimTasksRequest(step=step, rank_id="r0", max_tasks=4),
                            metadata=META, timeout=5)
    assert [t.prompt_key for t in claim.tasks] == ["p"]
    pushed = stub.PushDrafts(pb.PushDraftsRequest(step=step + 1, rank_id="r0", drafts=[
        pb.Draft(prompt_key="p", token_ids=[5, 6], complete=True)]), metadata=META, timeout=5)
    assert pushed.stored == 1
    fetched = stub.FetchDrafts(pb.FetchDraftsRequest(step=step + 1, prompt_keys=["p"]),
                               timeout=5)
    assert [list(d.token_ids) for d in fetched.drafts] == [[5, 6]]


@pytest.fixture(scope="module")
def daemon() -> Iterator[pb_grpc.SynchronizerStub]:
    d = Daemon("--token", TOKEN, "--metrics-port", "-1", "--heartbeat-interval-s", "0.2",
               "--rank-timeout-s", "1")
    channel = grpc.insecure_channel(d.address, options=[
        ("grpc.max_send_message_length", 64 * 1024 * 1024)])
    try:
        stub = pb_grpc.SynchronizerStub(channel)
        normal_step(stub, 0)
        yield stub
    finally:
        channel.close()
        d.stop()


@pytest.mark.parametrize("method", sorted(SERVICE.methods_by_name))
def test_no_request_is_an_internal_error(daemon: pb_grpc.SynchronizerStub, method: str) -> None:
    desc = SERVICE.methods_by_name[method].input_type

    @given(messages(desc))
    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    def run(request: Message) -> None:
        code = call(daemon, method, request)
        assert code not in BAD_CODES, f"{method}({request!s:.500}) -> {code}"

    run()


def test_the_daemon_still_runs_a_normal_step_afterwards(
        daemon: pb_grpc.SynchronizerStub) -> None:
    # ranks the examples registered (some with a tiny vocabulary) never heartbeat: once
    # they are LOST they no longer narrow the vocabulary
    time.sleep(1.5)
    state = daemon.GetState(pb.GetStateRequest(), timeout=5)
    step = (state.current_step if state.HasField("current_step") else 0) + 1
    normal_step(daemon, step)
