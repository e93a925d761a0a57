"""Decode-step (forward pass) time of one GPU inference engine: the one model that the paced
engines sleep to (`bubblespec.engine.pace`) and the simulator charges (`bubblespec.sim`).

It lives in the core (stdlib + numpy, no engine, no simulator) so that a rank engine loads
the arithmetic without loading the simulator, and both sides keep using the same figures.
All figures here are MODELLED, derived from datasheet numbers and stated efficiencies; none
was measured on a GPU by this project.

One forward pass of a rank's engine (continuous batching, every running sequence advances by
one forward) takes

    t = t_fixed + t_token * W + t_flop * max(0, W - ridge) + t_kv * C

- W: tokens in the forward = sum over running sequences of (1 + drafted tokens verified);
- C: context tokens whose KV cache is read = sum over running sequences of their length so
  far (prompt + generated);
- t_fixed: reading the weights once from HBM plus the engine's per-step overhead (scheduler,
  sampler, kernel-launch gaps with CUDA graphs);
- t_token: per-token work that is not hidden under the weight read (norms, rotary, KV write,
  logits and sampling);
- t_flop * max(0, W - ridge): the compute-bound excess of the roofline. Below `ridge` tokens
  the GEMMs are memory-bound and extra tokens (for instance verified draft tokens) are nearly
  free; above it each token costs its FLOPs;
- t_kv: reading one context token's K and V in attention (memory-bound).

Prefill of a prompt (when a sequence is admitted) costs `prompt_tokens * t_flop` (compute
bound); with prefix caching the n samples of a prompt share it.

Default derivation (Llama-3.1-8B in bf16 on one GPU, vLLM):
- weights 8.03e9 params x 2 B = 16.06 GB; KV per token = 2 (K,V) x 32 layers x 8 KV heads x
  128 dims x 2 B = 131,072 B; FLOPs per token = 2 x 8.03e9 = 16.06 GFLOP;
- H100 SXM: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16; H200: 4.8 TB/s HBM3e, 989 TFLOP/s
  (NVIDIA datasheets);
- stated efficiencies: 80% of peak HBM bandwidth in decode GEMV/attention kernels, 50% of peak
  FLOP/s in the compute-bound regime, 2 ms engine overhead per step, 5 us per-token extras.
=> H100: t_fixed = 16.06e9 / (0.8 x 3.35e12) + 2 ms = 5.99 + 2 = 7.99 ms; t_flop = 32.5 us;
   ridge = 5.99 ms / 32.5 us = 184 tokens; t_kv = 131072 / (0.8 x 3.35e12) = 48.9 ns.
   H200: t_fixed = 6.18 ms, t_flop = 32.5 us, ridge = 129 tokens, t_kv = 34.1 ns.
A step of 128 running sequences at ~2.5k context on an H100 then takes ~8 + 0.6 + 15.6 =
~24 ms (~5k tokens/s per GPU), in line with published vLLM decode figures for 8B models.
Not modelled: KV-cache capacity (preemption), tensor parallelism, CPU stalls.

The engine's host overhead (`t_host`, the 2 ms above, part of `t_fixed`) and what the
product adds per step (`step`):
- async scheduling (vLLM's default on a GPU for decoding without speculation; off for the
  `custom_class` and `suffix` drafters) overlaps the host's work with the GPU's, so such a
  step takes max(GPU time, host time) instead of their sum;
- the product's host work in a step (drafting, the keyed sampler's metadata) is measured and
  added to the host side; its device kernels (keyed noise, argmax and verification) are
  modelled (`keyed_kernel_s`) and added to the GPU side.
Keyed kernels are modelled at the modelled model's vocabulary (`MODEL_VOCAB`), whatever the
vocabulary of the CPU model that stands in for it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

# NVIDIA datasheet figures: HBM bandwidth (bytes/s), dense bf16 tensor FLOP/s.
GPUS: dict[str, tuple[float, float]] = {
    "h100": (3.35e12, 989e12),
    "h200": (4.8e12, 989e12),
}
HBM_EFFICIENCY = 0.8
"""Share of peak HBM bandwidth reached by decode kernels (stated assumption)."""
COMPUTE_EFFICIENCY = 0.5
"""Share of peak FLOP/s reached in compute-bound GEMMs (stated assumption)."""
ENGINE_OVERHEAD_S = 2e-3
"""Per-step engine overhead: scheduling, sampling, launch gaps (stated assumption)."""
PER_TOKEN_EXTRA_S = 5e-6
"""Per-token work not hidden under the weight read (stated assumption)."""
FP64_FLOPS: dict[str, float] = {"h100": 34e12, "h200": 34e12}
"""Peak fp64 vector FLOP/s (non-tensor; NVIDIA datasheets): the keyed noise is fp64."""
MODEL_VOCAB = 128_256
"""Vocabulary of the modelled model (Llama-3.1-8B): the keyed kernels' width."""
KERNEL_LAUNCH_S = 5e-6
"""Cost of one eager kernel launch on the step's stream (stated assumption)."""
EAGER_KEYED_BYTES = 412.0
"""Bytes read + written per (position x vocab) element by the eager keyed argmax: 25
elementwise kernels over int64 / float64 intermediates (counted by dispatching the eager
twin, tests/core/test_engine_time.py)."""
FUSED_KEYED_BYTES = 4.0
"""The same for the fused kernel: it reads the fp32 logits once and writes nothing wide."""
FUSED_KEYED_FP64_OPS = 60.0
"""fp64-class operations per element of the fused kernel (two SplitMix64 rounds in int64,
two logs, an add and a compare; stated estimate): it is compute-bound, not memory-bound."""


@dataclass(frozen=True)
class EngineTime:
    """Parameters of the forward-time model (seconds); see the module docstring."""

    t_fixed: float
    """Seconds per forward regardless of batch: weight read + engine overhead."""
    t_token: float
    """Seconds per token in the forward (memory-bound extras)."""
    t_flop: float
    """Seconds of compute per token above the roofline ridge, and per prefill token."""
    ridge: float
    """Tokens per forward below which the GEMMs stay memory-bound."""
    t_kv: float
    """Seconds per context token whose KV is read in attention."""
    gpu: str = "custom"
    """Preset the figures came from."""
    t_host: float = 0.0
    """Of `t_fixed`, the engine's host overhead per step (scheduling, launches, output
    processing), which async scheduling overlaps with the GPU's work (`step`)."""
    fp64_flops: float = 34e12
    """Peak fp64 vector FLOP/s of the GPU (the keyed kernels' compute bound)."""
    hbm_bw: float = 3.35e12
    """Peak HBM bytes/s of the GPU (the keyed kernels' memory bound)."""

    @classmethod
    def preset(cls, gpu: str = "h100", params_b: float = 8.03, bytes_per_param: float = 2.0,
               kv_bytes_per_token: float = 131072.0) -> EngineTime:
        """Figures derived for `params_b` billion parameters on `gpu` (module docstring)."""
        if gpu not in GPUS:
            raise ValueError(f"unknown gpu preset {gpu!r}; known: {sorted(GPUS)}")
        bw, flops = GPUS[gpu]
        t_weights = params_b * 1e9 * bytes_per_param / (HBM_EFFICIENCY * bw)
        t_flop = 2 * params_b * 1e9 / (COMPUTE_EFFICIENCY * flops)
        return cls(t_fixed=t_weights + ENGINE_OVERHEAD_S, t_token=PER_TOKEN_EXTRA_S,
                   t_flop=t_flop, ridge=t_weights / t_flop,
                   t_kv=kv_bytes_per_token / (HBM_EFFICIENCY * bw), gpu=gpu,
                   t_host=ENGINE_OVERHEAD_S, fp64_flops=FP64_FLOPS[gpu], hbm_bw=bw)

    def with_overrides(self, **kw: float | None) -> EngineTime:
        """A copy with the given fields replaced (None values are ignored)."""
        d = asdict(self)
        changed = {k: v for k, v in kw.items() if v is not None}
        if changed:
            d.update(changed)
            d["gpu"] = f"{self.gpu}+overrides"
        return EngineTime(**d)

    def charged(self, async_host: bool = False, extra_host_s: float = 0.0) -> EngineTime:
        """The per-forward model of an engine that adds `extra_host_s` of host work to each
        step (drafting, the product's keyed host path), as `step` charges it, for the
        simulator's forward arithmetic (`per_forward`, `segment`): without `async_host` the
        host work is paid in series (`t_fixed` grows by it); with it (async scheduling) a
        step takes the longer of its GPU and host sides, so `t_fixed` becomes
        max(weights + extras on the GPU, t_host + extra): exact while the host side is
        shorter than the GPU side of a one-token forward (the presets: about 6 ms of
        weight reads against 2 ms of host), an upper bound otherwise."""
        if async_host:
            gpu = self.t_fixed - self.t_host
            return replace(self, t_fixed=max(gpu, self.t_host + extra_host_s), t_host=0.0)
        return replace(self, t_fixed=self.t_fixed + extra_host_s,
                       t_host=self.t_host + extra_host_s)

    def per_forward(self, tokens: np.ndarray | float) -> np.ndarray | float:
        """Seconds of one forward with `tokens` tokens, before the KV term."""
        return (self.t_fixed + self.t_token * tokens
                + self.t_flop * np.maximum(0.0, np.asarray(tokens, dtype=float) - self.ridge))

    def forward(self, tokens: float, context: float, prefill: float = 0.0) -> float:
        """Seconds of ONE forward: `tokens` decode tokens (1 + drafted tokens per running
        sequence), `context` KV tokens read, `prefill` prompt tokens computed (compute bound,
        as the simulator charges a prompt's prefill). The paced engines of
        `bubblespec.engine.pace` sleep to this figure."""
        return float(self.per_forward(float(tokens)) + self.t_kv * context
                     + self.t_flop * prefill)

    def keyed_kernel_s(self, elements: float, launches: int, fused: bool = True) -> float:
        """MODELLED seconds of keyed kernels over `elements` (position x vocab) elements in
        `launches` kernel launches: the fused kernel is bound by its fp64 work or its read of
        the logits, the eager one by the bytes of its intermediates; each launch adds
        `KERNEL_LAUNCH_S`."""
        if fused:
            body = max(elements * FUSED_KEYED_FP64_OPS / (COMPUTE_EFFICIENCY * self.fp64_flops),
                       elements * FUSED_KEYED_BYTES / (HBM_EFFICIENCY * self.hbm_bw))
        else:
            body = elements * EAGER_KEYED_BYTES / (HBM_EFFICIENCY * self.hbm_bw)
        return body + launches * KERNEL_LAUNCH_S

    def step(self, tokens: float, context: float, prefill: float = 0.0, device_s: float = 0.0,
             host_s: float = 0.0, overlap_host: bool = False) -> float:
        """Seconds of one engine step: the forward (`forward`) with `device_s` of further
        device kernels on the GPU side and `host_s` of further host work beside the engine's
        own `t_host`; with `overlap_host` (async scheduling) the two sides overlap and the
        step takes the longer, else their sum."""
        gpu = self.forward(tokens, context, prefill) - self.t_host + device_s
        host = self.t_host + host_s
        return max(gpu, host) if overlap_host else gpu + host

    def segment(self, m: np.ndarray, tokens: np.ndarray, ctx0: np.ndarray,
                growth: np.ndarray) -> np.ndarray:
        """Seconds of `m` consecutive forwards with `tokens` tokens each, whose context sum
        starts at `ctx0` and grows by `growth` per forward (arithmetic series)."""
        m = np.asarray(m, dtype=float)
        return (m * self.per_forward(tokens)
                + self.t_kv * (m * ctx0 + growth * m * (m - 1) / 2.0))

    def describe(self) -> dict[str, float | str]:
        """Human-unit figures for reports."""
        return {"gpu": self.gpu, "t_fixed_ms": self.t_fixed * 1e3,
                "t_token_us": self.t_token * 1e6, "t_flop_us": self.t_flop * 1e6,
                "ridge_tokens": self.ridge, "t_kv_ns": self.t_kv * 1e9}
