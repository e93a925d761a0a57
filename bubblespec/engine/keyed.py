"""Keyed-noise sampling inside vLLM (see `bubblespec.core.keyed_noise` for the definition).

Requests opt in with `SamplingParams.extra_args = {"bubblespec_keyed_seed": s}` (plus
`"bubblespec_keyed_context": True` for context keys, `bubblespec.core.context_keys`, and
`"bubblespec_keyed_start": p` for a margin branch, whose response began p tokens before the
end of its prompt). For
those rows, plain sampling, the bonus token of a speculative step and the verification of
drafted positions all draw token t as argmax(processed_logits + g(key_t, .)), key_t the
position key of (s, t) or the context key of the tokens before t (for a drafted position:
the committed tokens and the drafts before it, which are the real tokens exactly when that
position's sample is used). Verification becomes
sample-and-match (accept a drafted token iff it equals the keyed sample at its position;
on the first mismatch emit the keyed sample), so the output is bit-identical to keyed
decoding without speculation. Other rows are left to vLLM's own samplers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bubblespec.core.context_keys import CONTEXT_LEN, ResponseKeys, mix64
from bubblespec.core.keyed_noise import GOLDEN, M64, MIX1, MIX2, VOCAB_STRIDE
from bubblespec.engine import vllm_glue
from bubblespec.engine.sampling import CONTEXT_ARG, KEY_ARG, START_ARG

PLACEHOLDER = -1


def _i64(x: int) -> int:
    """uint64 constant as the int64 with the same bits."""
    return x - (1 << 64) if x >= 1 << 63 else x


_G, _M1, _M2, _VS = (_i64(c) for c in (GOLDEN, MIX1, MIX2, VOCAB_STRIDE))


def _lsr(z: torch.Tensor, s: int) -> torch.Tensor:
    return (z >> s) & ((1 << (64 - s)) - 1)


def position_key(seed: int, position: int) -> int:
    """The position key of (seed, position), as `keyed_noise.position_key` computes it."""
    return mix64((seed & M64) ^ mix64(position & M64))


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 on int64 tensors with uint64 wrapping semantics (matches numpy)."""
    z = z + _G
    z = (z ^ _lsr(z, 30)) * _M1
    z = (z ^ _lsr(z, 27)) * _M2
    return z ^ _lsr(z, 31)


def uniforms_of_keys(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """u(key_b, v) for each row b: [B, vocab] float64, bit-identical to the reference."""
    v = torch.arange(vocab, dtype=torch.long, device=keys.device) * _VS
    z = splitmix64(keys.long()[:, None] + v[None, :])
    return (_lsr(z, 11).double() + 0.5) * (2.0 ** -53)


def keyed_argmax(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """argmax(logits + g(key)) per row; logits already temperature-scaled and masked."""
    g = -torch.log(-torch.log(uniforms_of_keys(keys, logits.shape[-1])))
    return torch.argmax(logits.double() + g, dim=-1)


def key_tensor(keys: list[int]) -> torch.Tensor:
    """uint64 keys as an int64 tensor with the same bits."""
    return torch.tensor([_i64(k) for k in keys], dtype=torch.long)


@dataclass
class _Row:
    """A keyed request in this step's batch."""

    row: int
    seed: int
    n_out: int  # committed output tokens: the next output position
    ctx: ResponseKeys | None  # context keys (seed_mode keyed_context), else position keys
    tail: list[int]  # the last CONTEXT_LEN committed tokens (context keys only)

    def keys(self, count: int, drafts: list[int]) -> list[int]:
        """Keys of output positions n_out .. n_out + count - 1, the later ones as if
        drafts[:i] were accepted (which is exactly when their samples are used)."""
        if self.ctx is None:
            return [position_key(self.seed, self.n_out + i) for i in range(count)]
        return self.ctx.lookahead(self.tail, drafts, count)


class KeyedSampling:
    """Installs the keyed rows' samplers on one model runner (worker process)."""

    def __init__(self, runner: Any, fault_context_only: bool = False) -> None:
        self.runner = runner
        self.fault_context_only = fault_context_only
        self.spec: tuple[list[int], list[list[int]]] | None = None
        self._opts: dict[str, tuple[int, bool, int] | None] = {}
        self._ctx: dict[str, ResponseKeys] = {}

    def _options(self, rid: str) -> tuple[int, bool, int] | None:
        """(seed, context keys?, output position of its first token) of a keyed request,
        None for other requests (cached)."""
        if rid not in self._opts:
            extra = vllm_glue.request_extra_args(self.runner, rid)
            self._opts[rid] = (None if not extra or KEY_ARG not in extra
                               else (int(extra[KEY_ARG]), bool(extra.get(CONTEXT_ARG)),
                                     int(extra.get(START_ARG, 0))))
        return self._opts[rid]

    def rows(self) -> list[_Row]:
        """The keyed requests of the batch, their next output positions and, for context
        keys, their key state brought up to date with the committed tokens."""
        batch = vllm_glue.batch_view(self.runner)
        out = []
        for i, rid in enumerate(batch.req_ids):
            opts = self._options(rid)
            if opts is None:
                continue
            seed, by_context, start = opts
            n_tok = int(batch.num_tokens_no_spec[i])
            n_prompt = int(batch.num_prompt_tokens[i]) - start  # where the response starts
            ctx, tail = None, []
            if by_context:
                ctx = self._ctx.get(rid)
                if ctx is None:
                    ctx = self._ctx[rid] = ResponseKeys(seed, n_prompt,
                                                        self.fault_context_only)
                ctx.sync(batch.token_ids[i, ctx.sync_start():n_tok].tolist(), n_tok)
                tail = batch.token_ids[i, max(0, n_tok - CONTEXT_LEN):n_tok].tolist()
            out.append(_Row(i, seed, n_tok - n_prompt, ctx, tail))
        if len(self._opts) > 4 * max(len(batch.req_ids), 64):
            live = set(batch.req_ids)
            self._opts = {k: v for k, v in self._opts.items() if k in live}
            self._ctx = {k: v for k, v in self._ctx.items() if k in live}
        return out

    def install(self) -> None:
        """Keyed rows: plain and bonus samples (sampler), drafted positions (verifier)."""
        vllm_glue.wrap_top_k_top_p_sampler(self.runner, self._wrap_sample)
        vllm_glue.on_spec_step(self.runner, self._set_spec)
        vllm_glue.wrap_rejection_sample(self._verify)

    def _set_spec(self, spec: tuple[list[int], list[list[int]]] | None) -> None:
        """During a speculative step the sampler draws the bonus tokens: row i's bonus
        token comes after its `spec[0][i]` drafted tokens `spec[1][i]`."""
        self.spec = spec

    def _wrap_sample(self, orig_sample: vllm_glue.SampleFn) -> vllm_glue.SampleFn:
        def sample(logits: torch.Tensor, generators: dict, k: Any, p: Any) -> Any:
            rows = self.rows()
            keep = logits.clone() if rows else None
            sampled, processed = orig_sample(logits, generators, k, p)
            if rows:
                keys = []
                for r in rows:
                    n, drafts = (0, []) if self.spec is None else (self.spec[0][r.row],
                                                                    self.spec[1][r.row])
                    keys.append(r.keys(n + 1, drafts)[-1])
                masked = vllm_glue.apply_top_k_top_p(keep, k, p)
                idx = torch.tensor([r.row for r in rows])
                sampled = sampled.clone()
                sampled[idx] = keyed_argmax(masked[idx], key_tensor(keys)).to(sampled.dtype)
            return sampled, processed

        return sample

    def _verify(self, out: torch.Tensor, draft_token_ids: torch.Tensor,
                num_draft_tokens: list[int], target_logits: torch.Tensor,
                bonus_token_ids: torch.Tensor, temps: Any) -> torch.Tensor:
        """Keyed rows of vLLM's verification output, redone by sample-and-match."""
        rows = self.rows()
        if not rows:
            return out
        starts = [0]
        for n in num_draft_tokens:
            starts.append(starts[-1] + n)
        for r in rows:
            if temps is not None and float(temps[r.row]) == 0.0:
                continue  # greedy rows: vLLM's greedy verification is already exact
            n, s = num_draft_tokens[r.row], starts[r.row]
            out[r.row].fill_(PLACEHOLDER)
            drafts = draft_token_ids[s:s + n].tolist() if n else []
            ys = (keyed_argmax(target_logits[s:s + n], key_tensor(r.keys(n, drafts))).tolist()
                  if n else [])
            j = 0
            while j < n:
                out[r.row, j] = ys[j]
                if ys[j] != drafts[j]:
                    break
                j += 1
            if j == n:
                out[r.row, n] = bonus_token_ids.view(-1)[r.row]
        return out
