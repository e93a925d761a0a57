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

KEY_ARG = "bubblespec_keyed_seed"
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
        batch = self.runner.input_batch
        idx, seeds, pos = [], [], []
        for i, rid in enumerate(batch.req_ids):
            seed = self._seed_cache.get(rid, -1)
            if seed == -1:
                st = self.runner.requests.get(rid)
                extra = getattr(st.sampling_params, "extra_args", None) if st else None
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
        import vllm.v1.sample.rejection_sampler as rs
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

        sampler = self.runner.sampler.topk_topp_sampler
        orig_sample = sampler.forward

        def sample(logits: torch.Tensor, generators: dict, k: Any, p: Any) -> Any:
            idx, seeds, pos = self.rows()
            keep = logits.clone() if idx else None
            sampled, processed = orig_sample(logits, generators, k, p)
            if idx:
                if self.bonus_offsets is not None:
                    pos = pos + torch.tensor([self.bonus_offsets[i] for i in idx])
                masked = apply_top_k_top_p(keep, k, p)
                rows = torch.tensor(idx)
                sampled = sampled.clone()
                sampled[rows] = keyed_argmax(masked[rows], seeds, pos).to(sampled.dtype)
            return sampled, processed

        sampler.forward = sample
        rsampler = getattr(self.runner, "rejection_sampler", None)
        if rsampler is not None:
            orig_forward = rsampler.forward

            def forward(metadata: Any, *args: Any, **kwargs: Any) -> Any:
                self.bonus_offsets = list(metadata.num_draft_tokens)
                try:
                    return orig_forward(metadata, *args, **kwargs)
                finally:
                    self.bonus_offsets = None

            rsampler.forward = forward
        if not getattr(rs.rejection_sample, "_bubblespec_keyed", False):
            rs.rejection_sample = _keyed_rejection(rs.rejection_sample, self)


def _keyed_rejection(orig: Any, ks: KeyedSampling) -> Any:
    """Wrap vLLM's rejection_sample: keyed rows are verified by sample-and-match."""

    def rejection_sample(draft_token_ids: torch.Tensor, num_draft_tokens: list[int],
                         max_spec_len: int, cu_num_draft_tokens: torch.Tensor,
                         draft_probs: Any, target_logits: torch.Tensor,
                         bonus_token_ids: torch.Tensor, sampling_metadata: Any,
                         *args: Any, **kwargs: Any) -> torch.Tensor:
        out = orig(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                   draft_probs, target_logits, bonus_token_ids, sampling_metadata,
                   *args, **kwargs)
        idx, seeds, pos = ks.rows()
        if not idx:
            return out
        temps = sampling_metadata.temperature
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

    rejection_sample._bubblespec_keyed = True  # type: ignore[attr-defined]
    return rejection_sample
