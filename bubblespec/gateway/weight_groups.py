"""A trainer's weight push without a checkpoint, fanned out to the ranks
(`protocol/weights.py`): over a process group, or as tensors a colocated trainer hands over;
and a colocated trainer's release and resume of the engines' memory.

The trainer opens a named group (`open`): every ready rank joins it, rank `rank_offset + i`
for the i-th rank by id, and the gateway remembers which ranks those are. Several groups may
be open at once (slime opens one per pipeline stage of its trainer, `slime-pp_<i>`, each
broadcasting that stage's tensors): their buckets stage into one push. Each bucket
(`bucket`) goes to its group's ranks at once, while the trainer broadcasts it; the ranks
stage it. `commit` (SGLang's `/continue_generation`, or the bubblespec route) loads the
staged push on every rank at once with its version. Weight calls hold the rollout lock, so no step runs
while a push is received or loaded, and the ranks advertise the new version only once the
push is whole. A failure names the ranks; a rank's refusal (4xx) is the caller's 4xx.

Handed-over tensors (`tensors`, SGLang's `/update_weights_from_tensor`) go to every rank that
takes weights, each staging them from the trainer's shared memory; a call after which every
rank holds the whole model loads the push at once (SGLang applies each call; a push in
several calls is loaded by the call that completes it, by `/continue_generation` or the
commit route). A call some rank refuses drops the whole push on every rank, so the ranks
never stage different weights.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from bubblespec.gateway.errors import RankCallError
from bubblespec.gateway.rollout import Rollouts
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.weights import (
    InitWeightsGroupIn,
    WeightsFromDistributedIn,
    WeightsFromTensorIn,
)


@dataclass
class Group:
    """An open group: its name, the ranks in it (in rank order) and its deadline."""

    name: str
    ranks: list[Any]
    timeout_s: float
    version: int | None = None
    """The version of the push being staged (None: nothing staged)."""


def _push_version(given: int | None, staged: int | None, ranks: list[Any]) -> int:
    """A push's version: the one the trainer gave, else that of the push being staged, else
    the ranks' newest + 1."""
    if given is not None:
        return given
    if staged is not None:
        return staged
    return max((r.weight_version or 0 for r in ranks), default=0) + 1


class WeightGroups:
    """The trainer's weight groups with the ranks (one open at a time)."""

    def __init__(self, rollouts: Rollouts) -> None:
        self.rollouts = rollouts
        self.groups: dict[str, Group] = {}
        """The open groups by name."""
        self.tensor_push: Group | None = None
        """A push of handed-over tensors staged and not loaded yet (None: none)."""

    def _fan(self, group: Group, route: str, body: dict[str, Any] | None = None,
             slack_s: float = 30.0) -> Any:
        pool, t = self.rollouts.pool, group.timeout_s + slack_s
        return asyncio.gather(*(pool.post(r, route, body or {}, t) for r in group.ranks),
                              return_exceptions=True)

    @staticmethod
    def _raise(what: str, group: Group, results: list[Any]) -> list[dict[str, Any]]:
        """The ranks' answers, or the ApiError that names the ranks that failed."""
        errors = [r for r in results if isinstance(r, RankCallError)]
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, RankCallError):
                raise r
        if not errors:
            return list(results)
        bad = "; ".join(str(e) for e in errors)
        statuses = {e.status for e in errors}
        if all(s is not None and 400 <= s < 500 for s in statuses):
            status = statuses.pop() if len(statuses) == 1 else 400
            raise ApiError(status, f"{what} refused: {bad}", errors[0].field or "names")
        raise ApiError(502, f"{what} failed on {len(errors)} of {len(group.ranks)} rank(s): "
                            f"{bad}", errors[0].field or "group_name")

    def _open_group(self, name: str) -> Group:
        g = self.groups.get(name)
        if g is None:
            opened = ", ".join(repr(n) for n in sorted(self.groups))
            raise ApiError(404, f"no weight group named {name!r} is open"
                                + (f" (open: {opened})" if opened else ""), "group_name")
        return g

    def _staged_version(self) -> int | None:
        """The version of the push the open groups are staging (None: nothing staged)."""
        return next((g.version for g in self.groups.values() if g.version is not None), None)

    async def open(self, body: InitWeightsGroupIn) -> dict[str, Any]:
        """Every ready rank joins the trainer's group; the world size must count them."""
        if body.backend != "gloo":
            raise ApiError(400, f"backend {body.backend!r}: the ranks receive over gloo "
                                "(bubblespec_gloo); NCCL pushes are not served yet", "backend")
        async with self.rollouts.lock:
            ready = await self._weight_ranks("join the weight group")
            if body.world_size != body.rank_offset + len(ready):
                raise ApiError(400, f"world_size {body.world_size} does not fit: rank_offset "
                                    f"{body.rank_offset} + {len(ready)} ready rank(s) = "
                                    f"{body.rank_offset + len(ready)}", "world_size")
            old = self.groups.pop(body.group_name, None)
            if old is not None:  # a group of that name is opened again: left first
                await self._fan(old, "/v1/weights/group/close", {"group_name": old.name})
            group = Group(body.group_name, ready, body.timeout_s)
            results = await asyncio.gather(*(
                self.rollouts.pool.post(r, "/v1/weights/group", {
                    "master_address": body.master_address, "master_port": body.master_port,
                    "rank_offset": body.rank_offset + i, "world_size": body.world_size,
                    "group_name": body.group_name, "timeout_s": body.timeout_s},
                    body.timeout_s + 30.0) for i, r in enumerate(ready)),
                return_exceptions=True)
            self._raise("joining the weight group", group, results)
            self.groups[group.name] = group
        return {"group_name": group.name, "ranks": [r.rank_id for r in ready]}

    async def bucket(self, body: WeightsFromDistributedIn) -> dict[str, Any]:
        """Every rank of the group receives one bucket into staging."""
        async with self.rollouts.lock:
            group = self._open_group(body.group_name)
            version = _push_version(body.version(), self._staged_version(), group.ranks)
            results = await self._fan(group, "/v1/weights/bucket", {
                "names": body.names, "dtypes": body.dtypes, "shapes": body.shapes,
                "version": version, "group_name": group.name})
            try:
                answers = self._raise("weight bucket", group, results)
            except ApiError as e:
                if e.status >= 500:  # the ranks closed the group: nothing is staged
                    self.groups.pop(group.name, None)
                    for g in self.groups.values():
                        g.version = None
                raise
            group.version = version
        return {"version": version, "staged": {a["rank_id"]: a["staged"] for a in answers}}

    async def commit(self, name: str | None = None) -> dict[str, Any] | None:
        """Load the staged push on every rank; None when nothing is staged. `name`: a group
        that must be open (its push and the other groups' are one push); None: a staged
        push of handed-over tensors, else whatever the open groups staged."""
        async with self.rollouts.lock:
            if name is not None:
                self._open_group(name)
            if name is None and self.tensor_push is not None:
                group, self.tensor_push = self.tensor_push, None
                return await self._load(group)
            staging = [g for g in self.groups.values() if g.version is not None]
            if not staging:
                if name is not None:
                    raise ApiError(409, "no pushed weights are staged", "weight_version")
                return None
            ranks = {r.rank_id: r for g in staging for r in g.ranks}
            for g in staging:
                g.version = None
            return await self._load(Group(",".join(g.name for g in staging),
                                          [ranks[k] for k in sorted(ranks)],
                                          max(g.timeout_s for g in staging), 0))

    async def _load(self, group: Group) -> dict[str, Any]:
        """Every rank of `group` loads what it staged."""
        results = await self._fan(group, "/v1/weights/commit")
        group.version = None
        answers = self._raise("loading the pushed weights", group, results)
        return {"weight_version": max(int(a["weight_version"]) for a in answers),
                "ranks": {a["rank_id"]: int(a["weight_version"]) for a in answers}}

    async def _weight_ranks(self, what: str) -> list[Any]:
        """The ranks that take weights, by id (503 naming `what` when none is up)."""
        ranks = sorted((r for r in (await self.rollouts.discover()).ranks if r.takes_weights),
                       key=lambda r: r.rank_id)
        if not ranks:
            raise ApiError(503, f"no rank is up to {what}")
        return ranks

    async def tensors(self, body: WeightsFromTensorIn) -> dict[str, Any]:
        """Every rank stages the handed-over tensors; loaded at once when the model is whole
        on every rank (module doc)."""
        async with self.rollouts.lock:
            push = self.tensor_push or Group("tensors", await self._weight_ranks("take weights"),
                                             self.rollouts.config.weights_timeout_s)
            version = _push_version(body.version(), push.version, push.ranks)
            results = await self._fan(push, "/v1/weights/tensors", {
                "serialized": body.serialized_named_tensors[0],
                "load_format": body.load_format, "version": version})
            try:
                answers = self._raise("handed-over tensors", push, results)
            except ApiError:
                self.tensor_push = None  # no rank keeps a push another one refused
                await self._fan(push, "/v1/weights/discard")
                raise
            push.version = version
            if not all(a["complete"] for a in answers):
                self.tensor_push = push
                return {"weight_version": version, "loaded": False,
                        "staged": {a["rank_id"]: a["staged"] for a in answers}}
            self.tensor_push = None
            return {**await self._load(push), "loaded": True}

    async def memory(self, action: str, tags: list[str] | None) -> dict[str, Any]:
        """Release or resume (`action`) the engines' memory on every rank that takes weights
        (colocated trainers: pre-generation stops first, drafts stay in the store)."""
        async with self.rollouts.lock:
            ranks = await self._weight_ranks("release or resume memory")
            group = Group("memory", ranks, self.rollouts.config.weights_timeout_s)
            results = await self._fan(group, f"/v1/memory/{action}", {"tags": tags})
        answers = self._raise(f"{action} memory", group, results)
        return {"ranks": {a["rank_id"]: a["released"] for a in answers}}

    async def close(self, name: str) -> dict[str, Any]:
        """Every rank of the group leaves it (what is staged is dropped)."""
        async with self.rollouts.lock:
            group = self.groups.pop(name, None) or self._open_group(name)
            results = await self._fan(group, "/v1/weights/group/close", {"group_name": name})
        self._raise("closing the weight group", group, results)
        return {"group_name": name, "closed": True}
