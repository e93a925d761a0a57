"""The plugin's settings: `actor_rollout_ref.rollout.engine_kwargs.bubblespec` of a verl config.

verl's `RolloutConfig.engine_kwargs` is a free dict keyed by backend (`vllm`, `sglang`); the
`bubblespec` key holds these fields. Every field has a default, so a stock config needs none
of them. Unknown keys are refused (a ValueError naming them), not ignored.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bubblespec.protocol.sampling import PregenWindow, SeedMode

NAMESPACE = "bubblespec"
"""Ray namespace of the server actor (and of the cluster's actors)."""
SERVER_NAME = "verl-bubblespec-server"
"""Name of the one server actor every replica and every trainer worker finds (not
prefixed `bubblespec-`: `bubblespec ray status/down` treat those as the cluster's actors)."""


LOOKAHEAD = 3
"""Default batches handed ahead: three. On 8 paced ranks three batches ahead beat the next
batch alone in every run (four runs, two seeds; docs/results.md, "Keyed rows on two
seeds" and "Prompts handed several steps ahead"): a short step's bubble no longer starves
the step after it. Two ahead lost twice; 1 hands the next batch only."""


class BubbleSpecSettings(BaseModel):
    """What the replica starts and how the server actor batches (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gateway: str | None = Field(
        None, description="URL of a running bubblespec gateway to use instead of starting a "
        "cluster on the Ray cluster (`bubblespec ray up` or the Kubernetes deployment).")
    token: str | None = Field(None, description="Bearer token of the gateway and ranks.")
    ranks: int | None = Field(
        None, ge=1, description="Rank servers to start [rollout devices / tensor parallel "
        "size: n_gpus_per_node x nnodes, or the trainer's world size in hybrid mode].")
    rank_args: tuple[str, ...] = Field((), description="Extra `bubblespec rank` flags.")
    gateway_args: tuple[str, ...] = Field((), description="Extra `bubblespec gateway` flags.")
    sync_args: tuple[str, ...] = Field((), description="Extra `bubblespec sync` flags.")
    cluster_name: str = Field("bubblespec-verl", description="Prefix of the cluster's actor "
                              "names (`bubblespec ray status --name bubblespec-verl`).")
    cpus_per_bundle: float = Field(1.0, gt=0, description="CPUs each rank's bundle reserves.")
    start_timeout_s: float = Field(600.0, gt=0)
    log_dir: str | None = Field(None, description="Per-node log directory of the cluster.")
    seed_mode: SeedMode | None = Field(
        None, description="`keyed`: keyed-noise sampling, bit-reproducible with speculation "
        "on or off and coupled to the pre-generated drafts; `default`: vLLM's sampler. "
        "Unset: the gateway's choice (keyed on steps that hand the next batch ahead).")
    pregen: bool = Field(True, description="Pre-generate the next batch in each step's bubble.")
    lookahead: int = Field(
        LOOKAHEAD, ge=1, le=8, description="Training batches handed ahead with each step (1: "
        "the next batch only): a bubble that covered the next batch goes on to the ones "
        "after it, and drafts made under older weights are refreshed later.")
    pregen_window: PregenWindow | None = Field(
        None, description="`training`: also through the training window until the weight "
        "push (rollout devices idle while the trainer trains). Default: the gateway's.")
    weight_sync: Literal["group", "tensors", "disk"] = Field(
        "group", description="How the trainer's rank 0 pushes each weight version: "
        "`group`: broadcast over a gloo process group the rank servers join (no disk); "
        "`tensors`: handed over in shared memory (the trainer's rank 0 and every rank "
        "server on one host); `disk`: a safetensors directory under `weights_dir` the "
        "ranks reload.")
    trainer_address: str | None = Field(
        None, description="The address the rank servers reach the trainer's rank 0 at for "
        "the weight group [its node's IP as Ray reports it].")
    weights_dir: str = Field(
        os.path.join(tempfile.gettempdir(), "bubblespec-verl-weights"),
        description="Where the trainer's rank 0 writes each weight version; every rank "
        "server must see it (a shared filesystem across nodes).")
    linger_s: float = Field(0.05, gt=0, description="Quiet time that closes an unannounced "
                            "batch of generate calls (later turns of multi-turn agents).")
    idle_s: float = Field(10.0, gt=0, description="Quiet time that closes an announced "
                          "batch short of its count (a trajectory failed before generating).")
    request_timeout_s: float = Field(3700.0, gt=0, description="Deadline of a rollout step.")

    @classmethod
    def from_rollout_config(cls, rollout: Any) -> BubbleSpecSettings:
        """The settings in a verl rollout config (`RolloutConfig` or its DictConfig)."""
        kwargs = getattr(rollout, "engine_kwargs", None) or {}
        raw = kwargs.get("bubblespec") if isinstance(kwargs, Mapping) else None
        data = _plain(raw) if raw is not None else {}
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            bad = ", ".join(".".join(str(p) for p in err["loc"]) + f": {err['msg']}"
                            for err in e.errors())
            raise ValueError(f"actor_rollout_ref.rollout.engine_kwargs.bubblespec: {bad}") from None


def _plain(value: Any) -> Any:
    """An OmegaConf node (or anything mapping-like) as plain dicts and lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:
        pass
    return dict(value) if isinstance(value, Mapping) else value
