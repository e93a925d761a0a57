"""The synchronizer's journal: every state-changing request it acknowledged, on disk, so a
restarted daemon comes back with its step, its ranks, its task queue and its drafts.

What is kept: the requests that change the state the ranks and the gateway rely on
(RegisterRank, OpenStep, ReportDone, ClaimTasks that handed tasks, PushDrafts that stored a
draft, CloseStep), each appended after its handler applied it and before its reply leaves,
so an acknowledged draft is in the journal. A restarted daemon replays them through the same
handler bodies (`SynchronizerService.replay`), in order. What is not: heartbeats (liveness is
re-learnt from the next ones; a rank that never comes back is marked LOST after
`rank_timeout_s`, as any silent rank), timeline spans, and the times of events (a replayed
step's open and stop times are the replay's).

Durability: each record is written to the OS before the reply (it survives the daemon's
death: SIGKILL, OOM, a crash); `fsync` also forces it to the disk (it survives the
machine's), at one fsync per acknowledged request.

The file stays bounded: when a step opens, the records no replay needs any more are cut.
Replay must start at the OpenStep of the oldest step during which a live draft (one for a
step not yet over) was pushed, because a push is accepted only while such a step is open;
the registrations before the cut are kept (the newest per rank). The rewrite copies only
what is kept, when the dead part is larger than it (amortised, each byte is copied at most
about once).

Format: `BSJ1\\n`, then records of a 1-byte method code, a 4-byte big-endian length and the
request's protobuf bytes. A torn last record (the daemon died mid-write) is dropped at load.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError, Message

from bubblespec.rpc.v1 import synchronizer_pb2 as pb

log = logging.getLogger("bubblespec.synchronizer.journal")

MAGIC = b"BSJ1\n"
_HEAD = struct.Struct(">BI")

#: Method code -> (method name, request type); the codes are the file format: never reuse.
METHODS: dict[int, tuple[str, type[Message]]] = {
    1: ("RegisterRank", pb.RegisterRankRequest),
    2: ("OpenStep", pb.OpenStepRequest),
    3: ("CloseStep", pb.CloseStepRequest),
    4: ("ReportDone", pb.ReportDoneRequest),
    5: ("ClaimTasks", pb.ClaimTasksRequest),
    6: ("PushDrafts", pb.PushDraftsRequest),
}
CODES: dict[str, int] = {name: code for code, (name, _) in METHODS.items()}
JOURNALED = frozenset(CODES)
"""The methods whose acknowledged requests are journaled."""


class JournalError(RuntimeError):
    """The journal file is not one (wrong header) or cannot be read."""


@dataclass
class _Entry:
    method: str
    offset: int
    length: int
    key: str | int | None
    """rank_id of a RegisterRank, step of an OpenStep; None otherwise."""


class Journal:
    """Append-only log of acknowledged requests at `path` (created if absent)."""

    def __init__(self, path: str | Path, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._entries: list[_Entry] = []
        self._current: int | None = None  # the newest step opened in the journal
        self._first_push: dict[int, int] = {}  # target step -> oldest open step it was pushed in
        self._file = None
        self.compactions = 0

    # ------------------------------------------------------------------ load, replay

    def load(self) -> list[tuple[str, Message]]:
        """The journaled requests in order (empty for a new file), and open for appending.
        Drops a torn last record; raises JournalError for a file that is not a journal."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        out: list[tuple[str, Message]] = []
        end = len(MAGIC)
        if self.path.exists() and self.path.stat().st_size > 0:
            data = self.path.read_bytes()
            if not data.startswith(MAGIC):
                raise JournalError(f"{self.path}: not a bubblespec synchronizer journal")
            for method, request, offset, length in _records(data):
                out.append((method, request))
                self._index(method, request, offset, length)
                end = offset + length
            if end < len(data):
                log.warning("journal %s: dropping a torn last record (%d bytes)", self.path,
                            len(data) - end)
        else:
            self.path.write_bytes(MAGIC)
        self._file = open(self.path, "r+b")  # noqa: SIM115 - held open for appends
        self._file.truncate(end)
        self._file.seek(end)
        return out

    def _index(self, method: str, r: Message, offset: int, length: int) -> None:
        key: str | int | None = None
        if method == "RegisterRank":
            key = r.rank_id
        elif method == "OpenStep":
            key = self._current = r.step
        elif method == "PushDrafts" and self._current is not None:
            self._first_push[r.step] = min(self._first_push.get(r.step, self._current),
                                           self._current)
        self._entries.append(_Entry(method, offset, length, key))

    # ------------------------------------------------------------------ append

    def append(self, method: str, request: Message) -> None:
        """Journal one acknowledged request (to the OS; to the disk with `fsync`)."""
        assert self._file is not None, "load() first"
        payload = request.SerializeToString()
        offset = self._file.tell()
        self._file.write(_HEAD.pack(CODES[method], len(payload)) + payload)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self._index(method, request, offset, _HEAD.size + len(payload))

    @property
    def nbytes(self) -> int:
        """Size of the journal file."""
        return self._file.tell() if self._file is not None else 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # ------------------------------------------------------------------ compaction

    def compact(self, step: int) -> bool:
        """After OpenStep(`step`): cut what no replay needs (see the module doc) when the
        dead part outweighs the rest; True if the file was rewritten."""
        assert self._file is not None
        self._first_push = {s: c for s, c in self._first_push.items() if s >= step}
        oldest = min([step, *self._first_push.values()])
        cut = next((i for i, e in enumerate(self._entries)
                    if e.method == "OpenStep" and isinstance(e.key, int) and e.key >= oldest),
                   None)
        if cut is None or cut == 0:
            return False
        newest_reg: dict[str, int] = {}
        for i, e in enumerate(self._entries[:cut]):
            if e.method == "RegisterRank":
                newest_reg[str(e.key)] = i
        keep = sorted(newest_reg.values()) + list(range(cut, len(self._entries)))
        kept_bytes = sum(self._entries[i].length for i in keep)
        if self.nbytes - len(MAGIC) - kept_bytes <= kept_bytes:
            return False
        tmp = self.path.with_name(self.path.name + ".tmp")
        entries: list[_Entry] = []
        with open(tmp, "wb") as out:
            out.write(MAGIC)
            for i in keep:
                e = self._entries[i]
                self._file.seek(e.offset)
                entries.append(_Entry(e.method, out.tell(), e.length, e.key))
                out.write(self._file.read(e.length))
            out.flush()
            if self.fsync:
                os.fsync(out.fileno())
        os.replace(tmp, self.path)
        self._file.close()
        self._file = open(self.path, "r+b")  # noqa: SIM115
        self._file.seek(0, os.SEEK_END)
        self._entries = entries
        self.compactions += 1
        return True


def _records(data: bytes) -> Iterator[tuple[str, Message, int, int]]:
    """(method, request, offset, length) of each whole record; stops at a torn one."""
    pos = len(MAGIC)
    while pos + _HEAD.size <= len(data):
        code, n = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + n
        if code not in METHODS or end > len(data):
            return
        method, kind = METHODS[code]
        request = kind()
        try:
            request.ParseFromString(data[pos + _HEAD.size : end])
        except DecodeError:
            return
        yield method, request, pos, end - pos
        pos = end
