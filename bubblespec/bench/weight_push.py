"""`bubblespec bench weight-push`: a weight push over a gloo process group and as tensors
handed over in shared memory, against a checkpoint on disk, on the same weights and ranks,
in one run.

    bubblespec bench weight-push                 # the warm-started policy, 2 ranks
    bubblespec bench weight-push --model DIR --ranks 2 --repeats 3

Starts a LocalCluster (synchronizer, `--ranks` ranks, gateway) on the model, loads the
model's tensors into this process (the trainer) with a perturbation per repeat (so each
push is new weights), and per repeat, rotating which path goes first:

- disk: the trainer writes the tensors as safetensors into a fresh directory
  (`save_file`, fsynced), then `POST /v1/weights` reloads them on every rank (validation,
  vLLM's in-place reload);
- gloo: `WeightGroup.push` broadcasts the tensors in buckets over the group (opened once,
  before the first repeat, its set-up timed apart) and commits them on every rank;
- tensors: `push_tensors` copies each bucket into shared memory and hands it over
  (`/update_weights_from_tensor`); every rank copies it into staging, and the last bucket
  loads the push (the trainer on the ranks' host, as a colocated one is).

All three end with every rank serving the new version; each is timed from the trainer's first
byte to the gateway's answer. Figures print side by side (median and each repeat) and go
to `--out` as JSON. A modelled row puts the same two paths at 8B in bf16 (16 GB) from stated
bandwidths; it is labelled modelled, not measured.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bubblespec.client import BubbleSpecClient
from bubblespec.client.weights import WeightGroup, push_tensors
from bubblespec.cluster import LocalCluster


@dataclass(frozen=True)
class WeightPushConfig:
    """What `bubblespec bench weight-push` runs (its flags)."""

    model: str
    ranks: int = 2
    repeats: int = 3
    bucket_mib: int = 512
    out: str = ""


@dataclass(frozen=True)
class Modelled:
    """The two paths at another size, from bandwidths (MODELLED, not measured)."""

    params_b: float = 8.0
    bytes_per_param: int = 2
    nccl_gb_s: float = 40.0
    """Effective broadcast bandwidth trainer -> rollout GPUs across nodes (400 Gb/s IB,
    80% bus efficiency)."""
    disk_write_gb_s: float = 2.0
    """The trainer writing to shared storage (a parallel file system, one writer)."""
    disk_read_gb_s: float = 2.0
    """Each rollout node reading the checkpoint back (ranks read in parallel)."""
    load_gb_s: float = 20.0
    """Loading into the model inside the engine (copy and weight processing), charged to
    both paths alike."""

    def figures(self) -> dict[str, float]:
        gb = self.params_b * self.bytes_per_param
        load = gb / self.load_gb_s
        return {"gigabytes": gb,
                "nccl_s": gb / self.nccl_gb_s + load,
                "disk_s": gb / self.disk_write_gb_s + gb / self.disk_read_gb_s + load}


def _tensors(model: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _perturbed(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: (v.float() + 1e-3 * torch.randn(v.shape, generator=gen)).to(v.dtype)
            if v.ndim == 2 else v for k, v in base.items()}


def _disk_push(client: BubbleSpecClient, model: str, weights: dict[str, torch.Tensor],
               root: Path, version: int) -> float:
    d = root / f"v{version}"
    d.mkdir()
    for f in Path(model).iterdir():  # config and tokenizer files: copied before the clock
        if f.is_file() and f.suffix != ".safetensors":
            (d / f.name).write_bytes(f.read_bytes())
    t0 = time.perf_counter()
    path = d / "model.safetensors"
    save_file(weights, str(path), metadata={"format": "pt"})
    with path.open("rb") as fh:
        os.fsync(fh.fileno())
    client.update_weights(str(d), version=version)
    return time.perf_counter() - t0


def run(cfg: WeightPushConfig) -> dict[str, Any]:
    """Run the benchmark; print and return its figures."""
    base = _tensors(cfg.model)
    size = sum(t.numel() * t.element_size() for t in base.values())
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-weight-push-") as tmp, \
            LocalCluster(ranks=cfg.ranks, model=cfg.model, start_timeout_s=600,
                         log_dir=Path(tmp) / "logs") as cluster, \
            BubbleSpecClient(cluster.gateway_url, timeout_s=600) as client:
        version = max(r.weight_version or 0 for r in client.ranks()) + 1
        group = WeightGroup(cluster.gateway_url, group_name="bench", timeout_s=600,
                            bucket_bytes=cfg.bucket_mib * 2**20)
        t0 = time.perf_counter()
        group.open(num_ranks=cfg.ranks)
        open_s = time.perf_counter() - t0
        try:
            paths = ("disk", "gloo", "tensors")
            for i in range(cfg.repeats):
                row: dict[str, float] = {}
                for j, path in enumerate(paths[i % 3:] + paths[:i % 3]):
                    w = _perturbed(base, 3 * i + j)
                    t0 = time.perf_counter()
                    if path == "disk":
                        row["disk_s"] = _disk_push(client, cfg.model, w, Path(tmp), version)
                    elif path == "gloo":
                        assert group.push(w.items(), version=version) == version
                        row["gloo_s"] = time.perf_counter() - t0
                    else:
                        assert push_tensors(cluster.gateway_url, w.items(), version,
                                            bucket_bytes=cfg.bucket_mib * 2**20) == version
                        row["tensors_s"] = time.perf_counter() - t0
                    version += 1
                rows.append(row)
                print(f"repeat {i}: disk {row['disk_s']:.2f} s, gloo {row['gloo_s']:.2f} s, "
                      f"tensors {row['tensors_s']:.2f} s", flush=True)
        finally:
            group.close()
    disk = statistics.median(r["disk_s"] for r in rows)
    gloo = statistics.median(r["gloo_s"] for r in rows)
    shm = statistics.median(r["tensors_s"] for r in rows)
    modelled = Modelled()
    out = {"config": asdict(cfg), "model_bytes": size, "tensors": len(base),
           "group_open_s": open_s, "repeats": rows, "median_disk_s": disk,
           "median_gloo_s": gloo, "speedup": disk / gloo, "median_tensors_s": shm,
           "tensors_speedup": disk / shm,
           "modelled_8b": {**asdict(modelled), **modelled.figures()}}
    print(f"\nweight push, {len(base)} tensors, {size / 2**20:.0f} MiB, {cfg.ranks} ranks, "
          f"{cfg.repeats} repeats (medians)")
    print(f"  disk (save + fsync + reload on every rank): {disk:8.2f} s")
    print(f"  gloo (broadcast in buckets + commit):       {gloo:8.2f} s   "
          f"({disk / gloo:.2f}x faster; group opened once in {open_s:.2f} s)")
    print(f"  tensors (shared memory, staged + loaded):   {shm:8.2f} s   "
          f"({disk / shm:.2f}x faster)")
    m = modelled.figures()
    print(f"  MODELLED 8B bf16 ({m['gigabytes']:.0f} GB): NCCL {m['nccl_s']:.1f} s vs disk "
          f"{m['disk_s']:.1f} s (bandwidths in bench/weight_push.py `Modelled`)")
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(out, indent=2))
    return out
