"""`BubbleSpecServerAdapter`: verl's `BaseRollout` in each trainer worker, for weight sync.

verl's synchronous weight sync (checkpoint backend `naive`) calls, in every trainer rank,
`rollout.update_weights(weights, global_steps=...)` with a generator of `(name, tensor)`
pairs in Hugging Face naming (FSDP gathers each full tensor, so every rank must drain the
generator). bubblespec ranks reload weights from a safetensors directory they validate
first, so the adapter:

1. drains the generator on every rank; rank 0 keeps each tensor the rank servers' model
   has (the manifest read from the model directory's safetensors headers), on the CPU, in
   that tensor's dtype (a bf16 trainer feeding an fp32 engine is cast, not refused);
   a tensor the engine's model has but the trainer did not send is an error naming it;
   names the engine's model lacks (a tied `lm_head.weight`) are dropped;
2. pushes them as version `global_steps + 1` (weight versions start at 0 and only go up):
   by default (`weight_sync: group`) over a gloo process group with every rank server
   (`bubblespec.client.weights.WeightGroup`, opened on the first push, the trainer's rank 0
   at `trainer_address`), loaded on every rank at once; with `weight_sync: tensors` it
   hands them over in shared memory (`push_tensors`, SGLang's `/update_weights_from_tensor`:
   the trainer's rank 0 and every rank server on one host); with `weight_sync: disk` it writes
   them to `<weights_dir>/v<version>/model.safetensors` and asks the server actor to reload
   every rank (`POST /v1/weights`), then removes the previous version's directory.

`resume` and `release` are no-ops: the rank servers hold their memory on their own devices.
LoRA adapters are not pushed as adapters (set `model.lora.merge=True`).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from bubblespec.engine.checkpoint import Manifest, read_manifest
from bubblespec.integrations.verl.replica import model_path
from bubblespec.integrations.verl.settings import NAMESPACE, SERVER_NAME, BubbleSpecSettings

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64}
"""safetensors dtype names of the manifest -> torch dtypes."""


def is_leader() -> bool:
    """Rank 0 of the trainer's process group (or no process group at all)."""
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


async def _pairs(weights: Any) -> AsyncIterator[tuple[str, torch.Tensor]]:
    if hasattr(weights, "__aiter__"):
        async for pair in weights:
            yield pair
    else:
        for pair in weights:
            yield pair


async def collect(weights: Iterable[tuple[str, torch.Tensor]] | Any, manifest: Manifest,
                  keep: bool) -> dict[str, torch.Tensor]:
    """Drain `weights`; with `keep`, the manifest's tensors as CPU tensors of its dtypes."""
    out: dict[str, torch.Tensor] = {}
    async for name, tensor in _pairs(weights):
        spec = manifest.get(name)
        if not keep or spec is None:
            continue
        if tuple(tensor.shape) != spec.shape:
            raise ValueError(f"weight {name}: shape {tuple(tensor.shape)}, the rank servers' "
                             f"model has {spec.shape}")
        dtype = DTYPES.get(spec.dtype)
        if dtype is None:
            raise ValueError(f"weight {name}: dtype {spec.dtype} is not supported")
        out[name] = tensor.detach().to("cpu", dtype).contiguous()
    if keep:
        missing = sorted(set(manifest) - set(out))
        if missing:
            raise ValueError(f"the trainer sent no {', '.join(missing[:5])}"
                             f"{' ...' if len(missing) > 5 else ''} ({len(missing)} tensors "
                             "of the rank servers' model missing)")
    return out


def write_version(tensors: dict[str, torch.Tensor], weights_dir: str, version: int) -> Path:
    """`<weights_dir>/v<version>/model.safetensors`, written to a temp name then renamed."""
    from safetensors.torch import save_file

    out = Path(weights_dir) / f"v{version}"
    tmp = Path(weights_dir) / f".v{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class BubbleSpecServerAdapter(BaseRollout):
    """verl's rollout adapter in a trainer worker (module docstring)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        self.settings = BubbleSpecSettings.from_rollout_config(self.config)
        self.version = 0
        self._manifest: Manifest | None = None
        self._last_dir: Path | None = None
        self._group: Any = None

    def _push(self, url: str, tensors: dict[str, torch.Tensor], version: int
              ) -> dict[str, Any]:
        """Push over the weight group (opened on first use; a group the ranks closed after
        a broken push is opened again on the next one)."""
        from bubblespec.client.weights import WeightGroup, WeightPushError

        s = self.settings
        if self._group is None:
            address = s.trainer_address or ray.util.get_node_ip_address()
            self._group = WeightGroup(url, master_address=address, group_name="verl",
                                      token=s.token, timeout_s=s.start_timeout_s)
            self._group.open()
        try:
            v = self._group.push(tensors.items(), version=version)
        except WeightPushError as e:
            if e.status >= 500:
                self._group.close()
                self._group = None
            raise
        return {"weight_version": v, "ranks": dict(self._group.last_ranks), "skipped": {}}

    def _hand_over(self, url: str, tensors: dict[str, torch.Tensor], version: int
                   ) -> dict[str, Any]:
        """Hand the tensors over in shared memory; every rank loads them at once."""
        from bubblespec.client.weights import push_tensors

        v = push_tensors(url, tensors.items(), version, token=self.settings.token,
                         timeout_s=self.settings.start_timeout_s)
        return {"weight_version": v, "ranks": {}, "skipped": {}}

    async def resume(self, tags: list[str]) -> None:
        """No-op: the rank servers keep weights and KV cache on their own devices."""

    async def release(self) -> None:
        """No-op (see `resume`)."""

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors",
                             **kwargs: Any) -> dict[str, Any] | None:
        """Write the trainer's weights and reload every rank with them (module docstring)."""
        if wire_format != "named_tensors":
            raise ValueError(f"wire_format {wire_format!r}: bubblespec takes named_tensors "
                             "(checkpoint_engine.backend=naive)")
        if kwargs.get("peft_config") is not None:
            raise ValueError("LoRA adapters are not pushed as adapters: set "
                             "actor_rollout_ref.model.lora.merge=True")
        leader = is_leader()
        if leader and self._manifest is None:
            self._manifest = read_manifest(model_path(self.model_config))
        tensors = await collect(weights, self._manifest or {}, keep=leader)
        if not leader:
            return None
        steps = kwargs.get("global_steps")
        version = int(steps) + 1 if steps is not None else self.version + 1
        server = ray.get_actor(SERVER_NAME, namespace=NAMESPACE)
        if self.settings.weight_sync in ("group", "tensors"):
            url = await server.gateway_url.remote()
            push = self._push if self.settings.weight_sync == "group" else self._hand_over
            result = await asyncio.to_thread(push, url, tensors, version)
            await server.set_global_steps.remote(steps)
            self.version = version
            return result
        path = write_version(tensors, self.settings.weights_dir, version)
        result = await server.update_weights.remote(str(path), version, steps)
        self.version = version
        if self._last_dir is not None and self._last_dir != path:
            shutil.rmtree(self._last_dir, ignore_errors=True)
        self._last_dir = path
        return dict(result)
