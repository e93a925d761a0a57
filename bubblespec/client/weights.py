"""A trainer's weight push to the rollout ranks without a checkpoint on disk: over a
process group, or as tensors handed over in shared memory by a trainer on the ranks' host.

    from bubblespec.client.weights import WeightGroup
    with WeightGroup("http://GATEWAY:8000", master_address="TRAINER_HOST") as group:
        for step in ...:
            train(...)
            group.push(model.state_dict().items(), version=step + 1)

The trainer is rank 0 of a named gloo group the ranks join (`open`, through the gateway's
`/init_weights_update_group`, slime's call); `push` sends buckets of named tensors with
`/update_weights_from_distributed`, broadcasting each bucket's tensors while the gateway's
call is in flight, then loads the push on every rank at once (`/v1/weights/commit`). The
names, dtypes and shapes are those of the model's checkpoint (Hugging Face names); a push
must cover every tensor of the model. Every call has a deadline (`timeout_s`; gloo's
collectives have the same), so a dead rank or gateway is an error, not a hang.

A trainer on the ranks' host (colocated: SGLang's `/update_weights_from_tensor`) hands the
tensors over instead, with no group to open:

    from bubblespec.client.weights import push_tensors
    push_tensors("http://GATEWAY:8000", model.state_dict().items(), version=step + 1)

Each bucket is copied once into shared memory (torch's `file_system` sharing) and sent as
handles (SGLang's `MultiprocessingSerializer` text); every rank copies it into staging, and
the call that completes the model loads it on every rank at once.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import io
import socket
import threading
from collections.abc import Iterable, Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any, Self

import httpx
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

DEFAULT_BUCKET_BYTES = 512 * 2**20
"""Bytes per bucket (slime's default)."""


class WeightPushError(RuntimeError):
    """The gateway refused or failed a weight call; `status` and `field` say which."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.field = field


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def buckets(named: Iterable[tuple[str, torch.Tensor]], max_bytes: int
            ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Named tensors cut into buckets of at most `max_bytes` (a larger tensor alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if bucket and size + n > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


class _Call:
    """One gateway call on a thread, answered while this thread broadcasts."""

    def __init__(self, http: httpx.Client, route: str, body: dict[str, Any]) -> None:
        self.reply: httpx.Response | BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(http, route, body), daemon=True)
        self.thread.start()

    def _run(self, http: httpx.Client, route: str, body: dict[str, Any]) -> None:
        try:
            self.reply = http.post(route, json=body)
        except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
            self.reply = e

    def result(self, timeout_s: float) -> dict[str, Any]:
        self.thread.join(timeout_s)
        return _answer(self.reply)


def _answer(reply: httpx.Response | BaseException | None) -> dict[str, Any]:
    if reply is None:
        raise WeightPushError(504, "the gateway did not answer within the deadline")
    if isinstance(reply, BaseException):
        raise WeightPushError(503, f"{type(reply).__name__}: {reply}")
    try:
        body = reply.json()
    except ValueError:
        body = {"message": reply.text}
    if reply.status_code >= 400:
        raise WeightPushError(reply.status_code, str(body.get("message", body)),
                              body.get("field"))
    return body


class WeightGroup:
    """The trainer's end of a weight group with every ready rank (module docstring)."""

    def __init__(self, gateway_url: str, *, master_address: str = "127.0.0.1",
                 master_port: int = 0, group_name: str = "bubblespec",
                 timeout_s: float = 120.0, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 token: str | None = None) -> None:
        self.master_address = master_address
        self.master_port = master_port or free_port(master_address)
        self.group_name = group_name
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=gateway_url.rstrip("/"), headers=headers,
                                 timeout=timeout_s + 60.0)
        self.store: Any = None
        self.group: Any = None
        self.ranks: list[str] = []
        self.last_ranks: dict[str, int] = {}
        """Per rank, the version the last push's commit left it on."""

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, num_ranks: int | None = None) -> list[str]:
        """Open the group with the gateway's ranks (`num_ranks`: how many to expect,
        default: those ready or with their memory released); the ranks' ids."""
        if num_ranks is None:  # ready ranks, and those whose memory a trainer released
            ranks = _answer(self.http.get("/v1/ranks"))["ranks"]
            num_ranks = sum(1 for r in ranks if r["ready"] or
                            (r["state"] == "released" and not r["error"]))
        world = 1 + num_ranks
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self.store = dist.TCPStore(self.master_address, self.master_port, world_size=world,
                                   is_master=True, timeout=timeout, wait_for_workers=False)
        call = _Call(self.http, "/init_weights_update_group", {
            "master_address": self.master_address, "master_port": self.master_port,
            "rank_offset": 1, "world_size": world, "group_name": self.group_name,
            "backend": "gloo", "timeout_s": self.timeout_s})
        try:
            self.group = dist.ProcessGroupGloo(dist.PrefixStore(self.group_name, self.store),
                                               0, world, timeout)
        finally:
            answer = call.result(self.timeout_s + 60.0)
        self.ranks = list(answer["ranks"])
        return self.ranks

    def push(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Send every tensor in buckets, then load them on every rank at once; the
        version the ranks now serve. Nothing is loaded if any bucket fails."""
        if self.group is None:
            raise WeightPushError(409, "the group is not open", "group_name")
        for bucket in buckets(named, self.bucket_bytes):
            tensors = [t.detach().to("cpu").contiguous() for _, t in bucket]
            call = _Call(self.http, "/update_weights_from_distributed", {
                "names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
                "shapes": [list(t.shape) for t in tensors], "group_name": self.group_name,
                "weight_version": str(version), "flush_cache": False})
            try:
                opts = dist.BroadcastOptions()
                opts.rootRank = 0
                for t in tensors:
                    self.group.broadcast([t], opts).wait()
            finally:
                call.result(self.timeout_s + 60.0)
        answer = _answer(self.http.post("/v1/weights/commit",
                                        json={"group_name": self.group_name}))
        self.last_ranks = {str(k): int(v) for k, v in answer.get("ranks", {}).items()}
        return int(answer["weight_version"])

    def close(self) -> None:
        """Leave the group on every rank (errors ignored, as slime does) and here."""
        if self.group is not None:
            try:
                self.http.post("/destroy_weights_update_group",
                               json={"group_name": self.group_name})
            except httpx.HTTPError:
                pass
        self.group = self.store = None
        self.http.close()


@contextlib.contextmanager
def _shared_by_file_name() -> Iterator[None]:
    """torch's `file_system` sharing strategy for the block: tensors put in shared memory
    are named files another process (an engine worker) can map."""
    before = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        tmp.set_sharing_strategy(before)


def serialize_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SGLang's `MultiprocessingSerializer` text of (name, tensor) pairs: a `ForkingPickler`
    dump in base64, CPU tensors shared by file name so that a process outside this one's
    tree can map them."""
    buf = io.BytesIO()
    with _shared_by_file_name():
        ForkingPickler(buf).dump([(str(n), t) for n, t in named])
    return base64.b64encode(buf.getvalue()).decode("ascii")


def push_tensors(gateway_url: str, named: Iterable[tuple[str, torch.Tensor]],
                 version: int | None = None, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 token: str | None = None, timeout_s: float = 900.0) -> int:
    """Hand every tensor to the ranks in buckets (module docstring), then make sure the push
    is loaded; the version the ranks now serve (`version` None: theirs + 1). The trainer's
    tensors are not shared: each bucket is copied into shared memory, freed once the ranks
    staged it. Nothing is loaded if any bucket is refused (WeightPushError names the
    field)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=gateway_url.rstrip("/"), headers=headers,
                      timeout=timeout_s) as http:
        answer: dict[str, Any] | None = None
        for bucket in buckets(named, bucket_bytes):
            with _shared_by_file_name():
                shared = [(name, torch.empty(t.shape, dtype=t.dtype).share_memory_()
                           .copy_(t.detach())) for name, t in bucket]
            answer = _answer(http.post("/update_weights_from_tensor", json={
                "serialized_named_tensors": [serialize_tensors(shared)],
                "weight_version": None if version is None else str(version),
                "flush_cache": False}))
            version = int(answer["weight_version"])
            del shared
        if answer is None:
            raise WeightPushError(400, "no tensor to push", "named")
        if not answer.get("loaded"):  # the buckets did not cover the model: say why
            answer = _answer(http.post("/v1/weights/commit", json={}))
        return int(answer["weight_version"])
