"""Keyed-noise sampling inside vLLM (see `bubblespec.core.keyed_noise` for the definition).

Requests opt in with `SamplingParams.extra_args = {"bubblespec_keyed_seed": s}`. For those
rows, plain sampling, the bonus token of a speculative step and the verification of drafted
positions all draw token t as argmax(processed_logits + g(s, t, .)): verification becomes
sample-and-match (accept a drafted token iff it equals the keyed sample at its position;
on the first mismatch emit the keyed sample), so the output is bit-identical to keyed
decoding without speculation. Other rows are left to vLLM's own samplers.
"""

from __future__ import annotations

from typing import Any

import torch

from bubblespec.core.keyed_noise import GOLDEN, MIX1, MIX2, VOCAB_STRIDE
from bubblespec.engine import vllm_glue
from bubblespec.engine.sampling import KEY_ARG

PLACEHOLDER = -1


def _i64(x: int) -> int:
    """uint64 constant as the int64 with the same bits."""
    return x - (1 << 64) if x >= 1 << 63 else x


_G, _M1, _M2, _VS = (_i64(c) for c in (GOLDEN, MIX1, MIX2, VOCAB_STRIDE))


def _lsr(z: torch.Tensor, s: int) -> torch.Tensor:
    return (z >> s) & ((1 << (64 - s)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 on int64 tensors with uint64 wrapping semantics (matches numpy)."""
    z = z + _G
    z = (z ^ _lsr(z, 30)) * _M1
    z = (z ^ _lsr(z, 27)) * _M2
    return z ^ _lsr(z, 31)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """u(s_b, t_b, v) for each row b: [B, vocab] float64, bit-identical to the reference."""
    key = splitmix64(seeds.long() ^ splitmix64(positions.long()))
    v = torch.arange(vocab, dtype=torch.long, device=seeds.device) * _VS
    z = splitmix64(key[:, None] + v[None, :])
    return (_lsr(z, 11).double() + 0.5) * (2.0 ** -53)


def gumbel(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    return -torch.log(-torch.log(uniforms(seeds, positions, vocab)))


def keyed_argmax(logits: torch.Tensor, seeds: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """argmax(logits + g) per row; logits already temperature-scaled and masked."""
    return torch.argmax(logits.double() + gumbel(seeds, positions, logits.shape[-1]), dim=-1)


class KeyedSampling:
    """Installs the keyed rows' samplers on one model runner (worker process)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.bonus_offsets: list[int] | None = None
        self._seed_cache: dict[str, int | None] = {}

    def rows(self) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Batch rows of keyed requests, their seeds and their next output positions."""
        batch = vllm_glue.batch_view(self.runner)
        idx, seeds, pos = [], [], []
        for i, rid in enumerate(batch.req_ids):
            seed = self._seed_cache.get(rid, -1)
            if seed == -1:
                extra = vllm_glue.request_extra_args(self.runner, rid)
                seed = None if not extra or KEY_ARG not in extra else int(extra[KEY_ARG])
                self._seed_cache[rid] = seed
            if seed is not None:
                idx.append(i)
                seeds.append(seed)
                pos.append(int(batch.num_tokens_no_spec[i]) - int(batch.num_prompt_tokens[i]))
        if len(self._seed_cache) > 4 * max(len(batch.req_ids), 64):
            live = set(batch.req_ids)
            self._seed_cache = {k: v for k, v in self._seed_cache.items() if k in live}
        return idx, torch.tensor(seeds, dtype=torch.long), torch.tensor(pos, dtype=torch.long)

    def install(self) -> None:
        """Keyed rows: plain and bonus samples (sampler), drafted positions (verifier)."""
        vllm_glue.wrap_top_k_top_p_sampler(self.runner, self._wrap_sample)
        vllm_glue.on_spec_step(self.runner, self._set_bonus_offsets)
        vllm_glue.wrap_rejection_sample(self._verify)

    def _set_bonus_offsets(self, num_draft_tokens: list[int] | None) -> None:
        """During a speculative step the sampler draws the bonus tokens: row i's bonus
        token sits num_draft_tokens[i] positions after its next output position."""
        self.bonus_offsets = num_draft_tokens

    def _wrap_sample(self, orig_sample: vllm_glue.SampleFn) -> vllm_glue.SampleFn:
        def sample(logits: torch.Tensor, generators: dict, k: Any, p: Any) -> Any:
            idx, seeds, pos = self.rows()
            keep = logits.clone() if idx else None
            sampled, processed = orig_sample(logits, generators, k, p)
            if idx:
                if self.bonus_offsets is not None:
                    pos = pos + torch.tensor([self.bonus_offsets[i] for i in idx])
                masked = vllm_glue.apply_top_k_top_p(keep, k, p)
                rows = torch.tensor(idx)
                sampled = sampled.clone()
                sampled[rows] = keyed_argmax(masked[rows], seeds, pos).to(sampled.dtype)
            return sampled, processed

        return sample

    def _verify(self, out: torch.Tensor, draft_token_ids: torch.Tensor,
                num_draft_tokens: list[int], target_logits: torch.Tensor,
                bonus_token_ids: torch.Tensor, temps: Any) -> torch.Tensor:
        """Keyed rows of vLLM's verification output, redone by sample-and-match."""
        idx, seeds, pos = self.rows()
        if not idx:
            return out
        starts = [0]
        for n in num_draft_tokens:
            starts.append(starts[-1] + n)
        for r, seed, base in zip(idx, seeds.tolist(), pos.tolist()):
            if temps is not None and float(temps[r]) == 0.0:
                continue  # greedy rows: vLLM's greedy verification is already exact
            n, s = num_draft_tokens[r], starts[r]
            out[r].fill_(PLACEHOLDER)
            if n:
                ys = keyed_argmax(target_logits[s:s + n], torch.full((n,), seed),
                                  torch.arange(base, base + n)).tolist()
                drafts = draft_token_ids[s:s + n].tolist()
            else:
                ys, drafts = [], []
            j = 0
            while j < n:
                out[r, j] = ys[j]
                if ys[j] != drafts[j]:
                    break
                j += 1
            if j == n:
                out[r, n] = bonus_token_ids.view(-1)[r]
        return out
