"""Keyed-noise sampling inside vLLM (see `bubblespec.core.keyed_noise` for the definition).

Requests opt in with `SamplingParams.extra_args = {"bubblespec_keyed_seed": s}` (plus
`"bubblespec_keyed_context": True` for context keys, `bubblespec.core.context_keys`, and
`"bubblespec_keyed_start": p` for a margin branch, whose response began p tokens before the
end of its prompt). For those rows, plain sampling, the bonus token of a speculative step
and the verification of drafted positions all draw token t as
argmax(processed_logits + g(key_t, .)), key_t the position key of (s, t) or the context key
of the tokens before t (for a drafted position: the committed tokens and the drafts before
it, which are the real tokens exactly when that position's sample is used). Verification
becomes sample-and-match (accept a drafted token iff it equals the keyed sample at its
position; on the first mismatch emit the keyed sample), so the output is bit-identical to
keyed decoding without speculation. Other rows are left to vLLM's own samplers.

Per engine step this module gathers the host metadata of the batch (`KeyedBatch`: which
rows are keyed, their seeds and next output positions; cached while the batch keeps its
requests) and hands device tensors to the batched kernels of `keyed_kernels`. When every
row of a step is keyed, vLLM's sampler and rejection sampler are not run at all; otherwise
they run for the other rows only in effect (their output is replaced on the keyed rows).

Position keys (`seed_mode: keyed`) stay on the device end to end: no host sync. Context keys
(`keyed_context`) are the slow path: each row's keys come from its tokens in Python, and a
verification step reads the drafted ids back to the host (`.tolist()`, a device sync on a
GPU) to key the drafted positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bubblespec.core.context_keys import CONTEXT_LEN, ResponseKeys
from bubblespec.engine import keyed_kernels as kk
from bubblespec.engine import vllm_glue
from bubblespec.engine.sampling import CONTEXT_ARG, KEY_ARG, START_ARG

GREEDY_EPS = 1e-5
"""Temperatures below this are greedy in vLLM (`_SAMPLING_EPS`): left to vLLM's argmax."""


@dataclass(frozen=True)
class _Options:
    """What a keyed request asked for (read once from its `extra_args`)."""

    seed: int  # int64 bits of the uint64 seed
    by_context: bool
    start: int  # output position of its first generated token
    greedy: bool


@dataclass(frozen=True)
class _Layout:
    """The keyed rows of a batch as long as its requests and their order stay the same."""

    key: tuple[str, ...]  # the batch's request ids, in order
    rows: np.ndarray  # [K] batch rows that are keyed and sampled
    opts: list[_Options]  # [K] their options
    seeds: np.ndarray  # [K] int64 seed bits
    starts: np.ndarray  # [K] output position of each one's first generated token
    context: list[int]  # indices into `rows` of the context-keyed ones


@dataclass
class KeyedBatch:
    """Host metadata of the keyed rows of one engine step (rows sampled with temperature
    > 0; greedy keyed rows are exact under vLLM's argmax and left to it)."""

    num_reqs: int
    rows: np.ndarray  # [K] batch rows that are keyed
    seeds: np.ndarray  # [K] int64 seed bits
    n_out: np.ndarray  # [K] next output position (committed output tokens)
    ctx: dict[int, tuple[ResponseKeys, list[int]]] = field(default_factory=dict)
    """Context-keyed rows (index into `rows`): their key state and last committed tokens."""

    @property
    def every_row(self) -> bool:
        """Every row of the batch is keyed (vLLM's samplers need not run)."""
        return len(self.rows) == self.num_reqs

    def per_row(self, values: np.ndarray) -> np.ndarray:
        """`values` [K] of the keyed rows spread over all [num_reqs] rows (0 elsewhere)."""
        out = np.zeros(self.num_reqs, dtype=np.int64)
        out[self.rows] = values
        return out


def _dev(values: np.ndarray | list[int], device: torch.device) -> torch.Tensor:
    """A host int64 array on `device` (a host-to-device copy: never a sync)."""
    return torch.as_tensor(np.asarray(values, dtype=np.int64)).to(device, non_blocking=True)


class KeyedSampling:
    """Installs the keyed rows' samplers on one model runner (worker process)."""

    def __init__(self, runner: Any, fault_context_only: bool = False) -> None:
        self.runner = runner
        self.fault_context_only = fault_context_only
        self.cost: Callable[[float, int, int], None] | None = None
        """Told each keyed call's host seconds, positions and kernel launches (the pacer's
        `product`, when the engine is paced)."""
        self.charge_kernel = "fused"
        """Which keyed kernel's launches `cost` is told ("fused" or "eager")."""
        self.spec: tuple[list[int], torch.Tensor] | None = None
        self._opts: dict[str, _Options | None] = {}
        self._ctx: dict[str, ResponseKeys] = {}
        self._layout: _Layout | None = None

    def _options(self, rid: str) -> _Options | None:
        """A keyed request's options, None for other requests (cached)."""
        if rid not in self._opts:
            extra = vllm_glue.request_extra_args(self.runner, rid)
            if not extra or KEY_ARG not in extra:
                self._opts[rid] = None
            else:
                temp = vllm_glue.request_temperature(self.runner, rid)
                self._opts[rid] = _Options(kk.i64(int(extra[KEY_ARG])),
                                           bool(extra.get(CONTEXT_ARG)),
                                           int(extra.get(START_ARG, 0)), temp < GREEDY_EPS)
        return self._opts[rid]

    def _keyed_layout(self, req_ids: list[str]) -> _Layout:
        """Batch rows of the keyed sampled requests, their seeds, first output positions and
        which of them are context-keyed; recomputed only when the batch's requests or their
        order change (the per-step host work is then a few array operations)."""
        key = tuple(req_ids)
        if self._layout is None or self._layout.key != key:
            rows, opts = [], []
            for i, rid in enumerate(key):
                o = self._options(rid)
                if o is not None and not o.greedy:
                    rows.append(i)
                    opts.append(o)
            self._layout = _Layout(
                key, np.asarray(rows, dtype=np.int64), opts,
                np.fromiter((o.seed for o in opts), dtype=np.int64, count=len(opts)),
                np.fromiter((o.start for o in opts), dtype=np.int64, count=len(opts)),
                [j for j, o in enumerate(opts) if o.by_context])
            if len(self._opts) > 4 * max(len(key), 64):
                live = set(key)
                self._opts = {k: v for k, v in self._opts.items() if k in live}
                self._ctx = {k: v for k, v in self._ctx.items() if k in live}
        return self._layout

    def batch(self) -> KeyedBatch:
        """The keyed rows of this step, their seeds and next output positions; context-keyed
        rows' key state brought up to date with their committed tokens."""
        view = vllm_glue.batch_view(self.runner)
        lay = self._keyed_layout(view.req_ids)
        rows, num_reqs = lay.rows, len(view.req_ids)
        if not len(rows):
            return KeyedBatch(num_reqs, rows, rows, rows)
        n_tok = np.asarray(view.num_tokens_no_spec[:num_reqs], dtype=np.int64)[rows]
        n_prompt = (np.asarray(view.num_prompt_tokens[:num_reqs], dtype=np.int64)[rows]
                    - lay.starts)
        kb = KeyedBatch(num_reqs, rows, lay.seeds, n_tok - n_prompt)
        for j in lay.context:  # slow path: keys from the row's tokens, in Python
            kb.ctx[j] = self._context_state(view, int(rows[j]), lay.opts[j], int(n_tok[j]),
                                            int(n_prompt[j]))
        return kb

    def _context_state(self, view: vllm_glue.BatchView, row: int, o: _Options, n_tok: int,
                       n_prompt: int) -> tuple[ResponseKeys, list[int]]:
        rid = view.req_ids[row]
        ctx = self._ctx.get(rid)
        if ctx is None:
            seed = o.seed & ((1 << 64) - 1)
            ctx = self._ctx[rid] = ResponseKeys(seed, n_prompt, self.fault_context_only)
        ctx.sync(view.token_ids[row, ctx.sync_start():n_tok].tolist(), n_tok)
        return ctx, view.token_ids[row, max(0, n_tok - CONTEXT_LEN):n_tok].tolist()

    def charge_to(self, cost: Callable[[float, int, int], None], kernel: str = "fused"
                  ) -> None:
        """Tell `cost` (host seconds, positions, kernel launches) of each keyed call from now
        on, its launches counted for the `kernel` ("fused" or "eager") keyed kernels."""
        self.cost, self.charge_kernel = cost, kernel

    def install(self) -> None:
        """Keyed rows: plain and bonus samples (sampler), drafted positions (verifier)."""
        vllm_glue.wrap_top_k_top_p_sampler(self.runner, self.wrap_sample)
        vllm_glue.on_spec_step(self.runner, self.set_spec)
        vllm_glue.wrap_rejection_sample(self.verify)

    def set_spec(self, spec: tuple[list[int], torch.Tensor] | None) -> None:
        """During a speculative step the sampler draws the bonus tokens: row i's bonus
        token comes after its `spec[0][i]` drafted tokens (ids: `spec[1]`, flat, on the
        device)."""
        self.spec = spec

    # ------------------------------------------------------------------ keys
    def _bonus_positions(self, kb: KeyedBatch) -> np.ndarray:
        """[K] each keyed row's sampled output position: its next one, after its drafted
        tokens in a speculative step."""
        if self.spec is None:
            return kb.n_out
        return kb.n_out + np.asarray(self.spec[0], dtype=np.int64)[kb.rows]

    def _bonus_context(self, kb: KeyedBatch, device: torch.device
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Context keys [K] of the context-keyed rows' sampled positions and their mask
        (None, None without such rows): the slow path, which reads the drafted ids back."""
        if not kb.ctx:
            return None, None
        flat = [] if self.spec is None else self.spec[1].tolist()
        counts = [0] * kb.num_reqs if self.spec is None else self.spec[0]
        starts = np.concatenate([[0], np.cumsum(counts)])
        keys = np.zeros(len(kb.rows), dtype=np.int64)
        mask = np.zeros(len(kb.rows), dtype=bool)
        for j, (state, tail) in kb.ctx.items():
            row = int(kb.rows[j])
            s, n = int(starts[row]), int(counts[row])
            keys[j] = kk.i64(state.lookahead(tail, flat[s:s + n], n + 1)[-1])
            mask[j] = True
        return _dev(keys, device), torch.as_tensor(mask).to(device, non_blocking=True)

    def _draft_context(self, kb: KeyedBatch, num_draft: list[int], draft_ids: torch.Tensor
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Context keys [T] of the context-keyed rows' drafted positions and their mask
        (None, None without such rows): the slow path, which reads the drafted ids back."""
        if not kb.ctx:
            return None, None
        flat = draft_ids.tolist()
        starts = np.concatenate([[0], np.cumsum(num_draft)])
        keys = np.zeros(len(flat), dtype=np.int64)
        mask = np.zeros(len(flat), dtype=bool)
        for j, (state, tail) in kb.ctx.items():
            row = int(kb.rows[j])
            s, n = int(starts[row]), int(num_draft[row])
            if n:
                keys[s:s + n] = [kk.i64(k) for k in state.lookahead(tail, flat[s:s + n], n)]
                mask[s:s + n] = True
        device = draft_ids.device
        return _dev(keys, device), torch.as_tensor(mask).to(device, non_blocking=True)

    def _charge(self, t0: float, host_end: float, positions: int, name: str) -> None:
        """Report one keyed call to the pacer: its host seconds (`t0` to `host_end`: the
        metadata and keys, before the kernels) and its kernels over `positions` rows."""
        if self.cost is not None:
            self.cost(host_end - t0, positions,
                      kk.launches(name, self.charge_kernel == "fused"))

    # ------------------------------------------------------------------ sampler, verifier
    def wrap_sample(self, orig_sample: vllm_glue.SampleFn) -> vllm_glue.SampleFn:
        def sample(logits: torch.Tensor, generators: dict, k: Any, p: Any) -> Any:
            t0 = time.perf_counter()
            kb = self.batch()
            if not len(kb.rows):
                return orig_sample(logits, generators, k, p)
            device = logits.device
            seeds = _dev(kb.seeds, device)
            positions = _dev(self._bonus_positions(kb), device)
            ctx_keys, ctx_mask = self._bonus_context(kb, device)
            if kb.every_row:  # vLLM's sampler has nothing left to sample
                host_end = time.perf_counter()
                masked = vllm_glue.apply_top_k_top_p(logits, k, p)
                processed = vllm_glue.processed_logits(self.runner, masked)
                out = kk.sample_rows(None, masked, seeds, positions, None, ctx_keys, ctx_mask)
                self._charge(t0, host_end, len(kb.rows), "sample")
                return out, processed
            idx = _dev(kb.rows, device)
            host_end = time.perf_counter()
            keep = logits.index_select(0, idx)  # vLLM's sampler masks `logits` in place
            sampled, processed = orig_sample(logits, generators, k, p)
            masked = vllm_glue.apply_top_k_top_p(
                keep, None if k is None else k.index_select(0, idx),
                None if p is None else p.index_select(0, idx))
            out = kk.sample_rows(sampled, masked, seeds, positions, idx, ctx_keys, ctx_mask)
            self._charge(t0, host_end, len(kb.rows), "sample")
            return out, processed

        return sample

    def verify(self, vllm_verify: vllm_glue.VerifyCall, draft_token_ids: torch.Tensor,
                num_draft_tokens: list[int], max_spec_len: int,
                cu_num_draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                bonus_token_ids: torch.Tensor) -> torch.Tensor:
        """The verification output: keyed rows by sample-and-match (batched), the others by
        vLLM's rejection sampler, which is not run when every row is keyed."""
        t0 = time.perf_counter()
        kb = self.batch()
        if not len(kb.rows):
            return vllm_verify()
        device = target_logits.device
        mine = np.zeros(kb.num_reqs, dtype=bool)
        mine[kb.rows] = True
        seeds, n_out = _dev(kb.per_row(kb.seeds), device), _dev(kb.per_row(kb.n_out), device)
        ctx_keys, ctx_mask = self._draft_context(kb, num_draft_tokens, draft_token_ids)
        mine_t = torch.as_tensor(mine).to(device, non_blocking=True)
        positions = int(np.asarray(num_draft_tokens, dtype=np.int64)[kb.rows].sum())
        host_end = time.perf_counter()
        out = None if kb.every_row else vllm_verify()
        res = kk.verify(out, draft_token_ids, cu_num_draft_tokens, target_logits,
                        bonus_token_ids, seeds, n_out, mine_t, max_spec_len, ctx_keys, ctx_mask)
        self._charge(t0, host_end, positions, "verify")
        return res
