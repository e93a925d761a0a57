"""The methods bubblespec adds to every vLLM worker (`worker_extension_cls`).

They run inside the engine-core process, between engine steps, called by the engine
(`engine.py`) with `AsyncLLM.collective_rpc("bubblespec_...")`. They wire bubblespec's
parts into the worker: the proposer (`proposer.py`), keyed-noise sampling (`keyed.py`),
paced forwards (`pace.py`), the memory probe (`heap.py`) and injected faults
(`faults.py`); what they need of vLLM's worker and model runner goes through `vllm_glue`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bubblespec.engine import vllm_glue, weight_group

weight_group.register()  # before the worker builds its weight-transfer engine


class WorkerExtension:
    """Mixed into every vLLM worker; each `bubblespec_*` method is one remote call."""

    def _drafter(self) -> Any:
        drafter = vllm_glue.proposer_of(self)
        if drafter is None or not hasattr(drafter, "bubblespec_configure"):
            raise RuntimeError("the engine was not started with bubblespec's proposer")
        return drafter

    def bubblespec_configure(self, options: dict) -> str:
        """Attach the runner to the proposer and pass its options; returns its kind."""
        drafter = self._drafter()
        drafter.runner = vllm_glue.runner_of(self)
        return drafter.bubblespec_configure(options)

    def bubblespec_install_keyed(self, fault_context_only: bool = False) -> bool:
        """Install keyed-noise sampling for requests that opt in (any spec mode; once), and
        vLLM's min_p and logit_bias processors; `fault_context_only` is the exactness tests'
        negative control."""
        from bubblespec.engine.keyed import KeyedSampling
        from bubblespec.engine.sampling import logit_bias_of, min_p_of

        if getattr(self, "_bubblespec_keyed", None) is None:
            self._bubblespec_keyed = KeyedSampling(vllm_glue.runner_of(self),
                                                   fault_context_only)
            self._bubblespec_keyed.install()
            # every engine gets this call at start: the CPU rewind of chunked seeded
            # requests rides along (without it such a batch kills the engine core), and so
            # do vLLM's min_p and logit_bias processors (left out when speculating)
            vllm_glue.install_cpu_generator_rewind(vllm_glue.runner_of(self))
            vllm_glue.install_min_p_and_logit_bias(vllm_glue.runner_of(self), min_p_of,
                                                   logit_bias_of)
        return True

    def bubblespec_reload_weights(self, path: str) -> bool:
        """Reload the weights from `path` in place (a tied LM head included), then return
        the heap's free pages to the kernel (`heap.trim`: the old tensors were just freed)."""
        from bubblespec.engine.heap import trim

        vllm_glue.reload_in_worker(vllm_glue.runner_of(self), path)
        trim()
        return True

    def _weight_group(self) -> Any:
        engine = vllm_glue.weight_transfer_engine_of(self)
        if engine is None:
            raise RuntimeError("the engine was started without a weight-transfer engine")
        return engine

    def bubblespec_commit_weights(self) -> int:
        """Load the staged push into the model (`GlooWeightEngine.commit`), then return the
        heap's free pages (the old tensors were just freed)."""
        from bubblespec.engine.heap import trim

        n = self._weight_group().commit(vllm_glue.runner_of(self))
        trim()
        return n

    def bubblespec_stage_tensors(self, text: str, load_format: str | None,
                                 manifest: dict[str, list]) -> dict[str, Any]:
        """Stage the tensors a colocated trainer handed over (`tensor_handles.decode`),
        copied out of the trainer's memory, beside what is staged already; nothing is staged
        when any of them cannot be read or does not fit the model's `manifest` (name, dtype,
        shape; a non-finite value; `manifest`: name -> [safetensors dtype, shape]).
        {"staged": n} or {"refused": [field, why]}."""
        import torch

        from bubblespec.engine.checkpoint import TensorSpec, check_bucket
        from bubblespec.engine.tensor_handles import HandleError, decode, dtype_name

        try:
            named = decode(text, load_format)
        except HandleError as e:
            return {"refused": ["serialized_named_tensors", str(e)]}
        if not named:
            return {"refused": ["serialized_named_tensors", "no tensor was sent"]}
        refusal = check_bucket([n for n, _ in named], [dtype_name(t) for _, t in named],
                               [list(t.shape) for _, t in named],
                               {k: TensorSpec(d, tuple(sh)) for k, (d, sh) in manifest.items()})
        if refusal is not None:
            return {"refused": list(refusal)}
        copies = []
        for name, t in named:
            c = t.detach().to("cpu", copy=True).contiguous()
            if c.is_floating_point() and not bool(torch.isfinite(c).all()):
                bad = int((~torch.isfinite(c)).sum())
                why = f"tensor {name}: {bad} non-finite value(s) (NaN or inf)"
                return {"refused": ["serialized_named_tensors", why]}
            copies.append((name, c))
        staged = self._weight_group().staged
        staged.update(copies)
        return {"staged": len(staged)}

    def bubblespec_close_weight_group(self, name: str) -> bool:
        """Leave weight group `name` (`GlooWeightEngine.close_group`); others stay open."""
        self._weight_group().close_group(name)
        return True

    def bubblespec_discard_weights(self) -> int:
        """Drop the staged push (`GlooWeightEngine.discard`)."""
        return self._weight_group().discard()

    def bubblespec_staged_weights(self) -> list[str]:
        """Names of the staged tensors (what a commit would load)."""
        return sorted(self._weight_group().staged)

    def _charged(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, its time charged to the next paced forward (`Pacer.between`)."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            pacer = getattr(self, "_bubblespec_pacer", None)
            if pacer is not None:
                pacer.between(time.perf_counter() - t0)

    def bubblespec_add_drafts(self, items: list[tuple]) -> int:
        return self._charged(self._drafter().add_drafts, items)

    def bubblespec_release(self, groups: list[str]) -> int:
        return self._charged(self._drafter().release, groups)

    def bubblespec_pop_stats(self, req_ids: list[str]) -> dict[str, tuple[int, ...]]:
        return self._charged(self._drafter().pop_stats, req_ids)

    def bubblespec_index_stats(self) -> dict[str, int]:
        return self._drafter().index_stats()

    def bubblespec_install_pace(self, profile: str, scale: float,
                                charge_drafting: bool = True, overlap_host: bool = False,
                                keyed_kernel: str = "fused") -> bool:
        """Pace this worker's forwards to `profile` x `scale` (once; `pace.py`), with the
        proposer's CPU time charged on top when `charge_drafting`, the keyed sampler's and
        verifier's costs charged always (their kernels modelled as `keyed_kernel`), and
        host and GPU overlapped when `overlap_host` (async scheduling)."""
        from bubblespec.engine.pace import Pacer, engine_time, forward_shape

        if getattr(self, "_bubblespec_pacer", None) is None:
            pacer = self._bubblespec_pacer = Pacer(
                engine_time(profile), scale, charge_drafting=charge_drafting,
                overlap_host=overlap_host, keyed_kernel=keyed_kernel)
            vllm_glue.install_pace(self, lambda *seen: pacer.begin(forward_shape(*seen)),
                                   pacer.end, pacer.drafted)
            keyed = getattr(self, "_bubblespec_keyed", None)
            if keyed is not None:
                keyed.charge_to(pacer.product, keyed_kernel)
        return True

    def bubblespec_install_poison(self, token: int) -> bool:
        """Fault injection: die on a prompt holding `token` (`faults.install_poison`; once)."""
        from bubblespec.engine.faults import install_poison

        if not getattr(self, "_bubblespec_poison", False):
            install_poison(self, token)
            self._bubblespec_poison = True
        return True

    def bubblespec_pace_stats(self) -> dict:
        """The pacer's counters (`PaceStats.as_dict`; empty if not paced)."""
        pacer = getattr(self, "_bubblespec_pacer", None)
        return pacer.stats.as_dict() if pacer is not None else {}

    def bubblespec_heap_stats(self) -> dict[str, int]:
        """This worker's memory, split (`heap.HeapProbe.snapshot`); the first call installs
        the probe, so forward shapes count from then on."""
        from bubblespec.engine.heap import HeapProbe

        probe = getattr(self, "_bubblespec_heap", None)
        if probe is None:
            probe = self._bubblespec_heap = HeapProbe()
            vllm_glue.on_forward(self, probe.seen)
        return probe.snapshot()

    def bubblespec_source_stats(self, reset: bool) -> dict[str, int]:
        return self._drafter().source_stats(reset)
