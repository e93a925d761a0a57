"""Bodies of a weight push without a checkpoint: the trainer's SGLang-shaped calls to the
gateway (slime's `/init_weights_update_group`, `/update_weights_from_distributed`,
`/destroy_weights_update_group`; a colocated trainer's `/update_weights_from_tensor`) and
the gateway's calls to each rank (`/v1/weights/group`, `/v1/weights/bucket`,
`/v1/weights/tensors`, `/v1/weights/commit`, `/v1/weights/group/close`).

Over a process group the trainer is rank 0 of a named gloo group; it broadcasts each
bucket's tensors in `names` order while the ranks receive them into staging. Handed-over
tensors are handles into the trainer's shared memory, read by each rank's engine worker.
Either way a commit loads the staged push at once.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from bubblespec.protocol import limits as L

MAX_TENSORS = 100_000
"""Most tensors one bucket may name."""
MAX_DIMS = 8
MAX_DIM = 2**31

MAX_SERIALIZED_CHARS = 64 * 2**20
"""Longest `serialized_named_tensors` entry (handles, not data: ~300 characters a tensor)."""

MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
"""What a colocated trainer releases and resumes (SGLang's tags; none or null: all)."""

GroupName = Annotated[str, Field(min_length=1, max_length=256)]
Shape = Annotated[list[Annotated[int, Field(ge=0, le=MAX_DIM)]], Field(max_length=MAX_DIMS)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Lenient(BaseModel):
    """A trainer's body: keys the gateway does not use are ignored, as SGLang does."""

    model_config = ConfigDict(extra="ignore")


class WeightGroupOpen(_Body):
    """POST /v1/weights/group (a rank): join the trainer's group as `rank_offset`."""

    master_address: str = Field(..., min_length=1, max_length=255)
    master_port: int = Field(..., ge=1, le=65535)
    rank_offset: int = Field(..., ge=1)
    world_size: int = Field(..., ge=2)
    group_name: GroupName = "bubblespec"
    timeout_s: float = Field(120.0, gt=0, le=3600,
                             description="Deadline of the join and of every collective.")

    @model_validator(mode="after")
    def _in_group(self) -> WeightGroupOpen:
        if self.rank_offset >= self.world_size:
            raise ValueError(f"rank_offset {self.rank_offset} is outside a group of "
                             f"{self.world_size}")
        return self


class _Tensors(BaseModel):
    """The tensors of one bucket, in broadcast order: names, dtypes and shapes alike long."""

    names: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        ..., min_length=1, max_length=MAX_TENSORS)
    dtypes: list[Annotated[str, Field(min_length=1, max_length=32)]] = Field(
        ..., max_length=MAX_TENSORS)
    shapes: list[Shape] = Field(..., max_length=MAX_TENSORS)

    @model_validator(mode="after")
    def _same_lengths(self) -> Self:
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(f"names, dtypes and shapes differ in length ({len(self.names)}, "
                             f"{len(self.dtypes)}, {len(self.shapes)})")
        return self


def version_text(v: str | int | None) -> str | int | None:
    """A weight version as SGLang's bodies carry it (a string or an integer), checked to be
    an integer in bubblespec's range (a ValueError otherwise)."""
    if v is not None and not (str(v).strip().isdigit() and int(str(v)) <= L.MAX_WEIGHT_VERSION):
        raise ValueError(f"must be an integer in [0, {L.MAX_WEIGHT_VERSION}]")
    return v


class WeightBucket(_Tensors):
    """POST /v1/weights/bucket (a rank): receive one bucket the trainer broadcasts in group
    `group_name`."""

    model_config = ConfigDict(extra="forbid")

    version: L.WeightVersion
    group_name: GroupName = "bubblespec"


class WeightGroupClose(_Body):
    """POST /v1/weights/group/close (a rank): leave group `group_name` (what is staged
    stays), or every group, dropping what is staged (None)."""

    group_name: GroupName | None = None


class InitWeightsGroupIn(_Lenient):
    """POST /init_weights_update_group (SGLang's shape, as slime sends it)."""

    master_address: str = Field(..., min_length=1, max_length=255)
    master_port: int = Field(..., ge=1, le=65535)
    rank_offset: int = Field(1, ge=1)
    world_size: int = Field(..., ge=2)
    group_name: GroupName = "weight_update_group"
    backend: Literal["gloo", "nccl"] = "gloo"
    timeout_s: float = Field(120.0, gt=0, le=3600, description="bubblespec: the group's "
                             "deadline for the join and every collective.")


class _PushCall(_Lenient):
    """What every SGLang call of a push carries: whether to flush the cache, the push's
    version."""

    flush_cache: bool = True
    weight_version: Annotated[str | int | None, AfterValidator(version_text)] = Field(
        None, description="A non-negative integer, the same on every call of one push "
                          "(default: the ranks' version + 1).")

    def version(self) -> int | None:
        return None if self.weight_version is None else int(str(self.weight_version))


class WeightsFromDistributedIn(_Tensors, _PushCall):
    """POST /update_weights_from_distributed (SGLang's shape): one bucket of a push."""

    model_config = ConfigDict(extra="ignore")

    group_name: GroupName = "weight_update_group"


class WeightsFromTensorIn(_PushCall):
    """POST /update_weights_from_tensor (SGLang's shape, as a colocated trainer sends it):
    one entry per tensor-parallel rank of an engine, each SGLang's
    `MultiprocessingSerializer` text of the named tensors (bubblespec ranks are TP 1: one
    entry, handed to every rank)."""

    serialized_named_tensors: list[Annotated[str, Field(min_length=1,
                                                        max_length=MAX_SERIALIZED_CHARS)]] = (
        Field(..., min_length=1, max_length=1, description="One entry (ranks are TP 1)."))
    load_format: Literal["flattened_bucket"] | None = None
    abort_all_requests: bool = False


class TensorBucket(_Body):
    """POST /v1/weights/tensors (a rank): stage handed-over tensors (`WeightsFromTensorIn`)."""

    serialized: str = Field(..., min_length=1, max_length=MAX_SERIALIZED_CHARS)
    load_format: Literal["flattened_bucket"] | None = None
    version: L.WeightVersion


class DestroyWeightsGroupIn(_Lenient):
    """POST /destroy_weights_update_group (SGLang's shape)."""

    group_name: GroupName = "weight_update_group"


class WeightCommitIn(_Lenient):
    """POST /v1/weights/commit (gateway): load the staged push on every rank of the group
    `group_name`; without one, whatever push is staged (handed-over tensors first)."""

    group_name: GroupName | None = None


class MemoryTagsIn(_Lenient):
    """POST /release_memory_occupation, /resume_memory_occupation (SGLang's shape; the
    rank's /v1/memory/release and /v1/memory/resume): `tags` None means all."""

    tags: list[Literal["weights", "kv_cache", "cuda_graph"]] | None = Field(
        None, max_length=len(MEMORY_TAGS))
