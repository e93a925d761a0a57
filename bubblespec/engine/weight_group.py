"""A trainer's process-group weight push, received by vLLM's weight-transfer API.

The trainer (rank 0 of a named gloo group) broadcasts each tensor of a bucket; every rank's
engine worker joins the group at `rank_offset` and receives the bucket through vLLM's
`update_weights` into a staging area, not into the model. The staged tensors are loaded at
once by `commit` (vLLM's in-place reload from an iterator, so its post-load processing and
the tied-head refresh run as for a disk reload), and only when the staged set is whole, so a
push that fails half-way leaves the old weights serving and nothing half-applied (slime's
"no half-updated model between buckets"). A bucket that cannot be loaded (a name the model
does not have, a wrong shape or dtype, a non-finite value) is still received in full, so
the trainer's broadcast completes and the group stays in step, and then refused.

Every collective has the group's deadline (`timeout_s`); a trainer that dies mid-bucket is
an error at the rank within it (gloo reports a closed peer at once), and the group is then
closed so that it can be opened again under the same name.

Several named groups may be open at once (slime opens one per pipeline stage of its
trainer, `slime-pp_<i>`, each broadcasting that stage's tensors); their buckets stage into
one push, loaded by one commit.

`GlooWeightEngine` is registered with vLLM's `WeightTransferEngineFactory` under
`WEIGHT_GROUP_BACKEND` (`register`, called where the worker extension is imported, in every engine
process); GPU ranks could use vLLM's own `nccl` engine in its place (not built here: no GPU
to test it on).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from bubblespec.engine import vllm_glue
from bubblespec.engine.types import WEIGHT_GROUP_BACKEND


def torch_dtype(name: str) -> torch.dtype:
    """A dtype by the name trainers send (`str(dtype)` without `torch.`)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"not a torch dtype: {name!r}")
    return dtype


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Where the trainer's group meets: its TCP store, this engine's rank, the deadline."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "bubblespec"
    timeout_s: float = 120.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One bucket: the tensors broadcast from rank 0 of group `group_name`, in this order.
    `discard`: receive and drop (the rank refused the bucket but keeps the group in step)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    discard: bool = False
    group_name: str = "bubblespec"


class GlooWeightEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """vLLM weight-transfer engine over a gloo group; receives into staging (module doc)."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.groups: dict[str, Any] = {}
        self.staged: dict[str, torch.Tensor] = {}

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        """Join the trainer's group (blocks until every member joined, or the deadline); a
        group of the same name is left first, other groups stay open."""
        self.close_group(init_info.group_name)
        timeout = datetime.timedelta(seconds=init_info.timeout_s)
        store = dist.TCPStore(init_info.master_address, init_info.master_port,
                              world_size=init_info.world_size, is_master=False,
                              timeout=timeout)
        rank = init_info.rank_offset + int(self.parallel_config.rank)
        self.groups[init_info.group_name] = dist.ProcessGroupGloo(
            dist.PrefixStore(init_info.group_name, store), rank, init_info.world_size, timeout)

    def start_weight_update(self) -> None:
        """Nothing to prepare: buckets go to staging, the model is touched at `commit`."""

    def finish_weight_update(self) -> None:
        """A bucket is in: nothing to do until `commit`."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # CPU: no device to sync

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        """Receive every tensor of the bucket (always, so the broadcast completes), then
        stage it; a non-finite value refuses the bucket (ValueError naming the tensor)."""
        group = self.groups.get(update_info.group_name)
        if group is None:
            raise RuntimeError(f"no weight group {update_info.group_name!r} is open on this "
                               "engine")
        received = []
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names,
                                           update_info.shapes):
            t = torch.empty([int(d) for d in shape], dtype=torch_dtype(dtype_name))
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            group.broadcast([t], opts).wait()
            received.append((name, t))
        if update_info.discard:
            return
        for name, t in received:
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"tensor {name}: {int((~torch.isfinite(t)).sum())} "
                                 "non-finite value(s) (NaN or inf)")
        self.staged.update(received)

    def commit(self, runner: Any) -> int:
        """Load every staged tensor into the model at once; how many were loaded."""
        items, self.staged = list(self.staged.items()), {}
        vllm_glue.reload_from_tensors(runner, items)
        return len(items)

    def discard(self) -> int:
        """Drop what is staged; how many tensors were dropped."""
        n, self.staged = len(self.staged), {}
        return n

    def close_group(self, name: str) -> None:
        """Leave group `name` (dropping it closes its connections); what is staged stays."""
        self.groups.pop(name, None)

    def shutdown(self) -> None:
        """Leave every group and drop what is staged."""
        self.groups = {}
        self.staged = {}


def register() -> None:
    """Register the gloo engine with vLLM's factory (once per process)."""
    vllm_glue.register_weight_transfer_engine(WEIGHT_GROUP_BACKEND, __name__,
                                              "GlooWeightEngine")
