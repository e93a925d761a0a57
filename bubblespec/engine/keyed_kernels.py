"""Keyed sampling's tensor work, batched and on the logits' device (the engine's hot path).

`bubblespec.core.keyed_noise` defines keyed sampling (numpy reference); this module is its
torch twin as the engine runs it, one call per engine step for the whole batch:

- `position_keys(seeds, positions)`: the noise key of each (seed, output position), computed
  on the device the seeds live on (SplitMix64 in int64 with uint64 wrapping);
- `keyed_argmax(logits, keys)`: argmax(logits + Gumbel(uniforms of key)) per row, the
  noise made where the logits are; backend "eager" (plain torch ops, the reference twin) or
  "compiled" (`torch.compile`: one fused kernel, Triton on CUDA, vectorised C++ on CPU);
- `verify(...)`: the sample-and-match verification of a speculative step for keyed rows:
  the drafted positions' keyed samples in one call, each row's first mismatch by a
  cumulative product, the output written with `torch.where` (no Python loop over rows, no
  device-to-host copy).

Every function takes device tensors and returns device tensors; host metadata (seeds, output
positions, which rows are keyed) is copied to the device once per step by the caller
(`engine/keyed.py`). tests/engine/test_keyed_fake_cuda.py runs these under torch's
`FakeTensorMode` with CUDA tensors: a host tensor mixed in, or a value read back to the host,
fails there. Bit-identity with the numpy reference and between the two backends is held by
tests/engine/test_keyed_kernels.py: the sampler's bonus path and the verifier use the same
`keyed_argmax`, which is what makes keyed decoding identical with speculation on or off.

Backend choice (`backend()`): ``BUBBLESPEC_KEYED_BACKEND`` = ``eager`` | ``compiled`` |
``auto`` (the default). ``auto`` takes the compiled kernel on CUDA only after it agreed bit
for bit with the eager twin on a probe batch on that device (`compiled_agrees`), else eager;
on CPU it stays eager: inductor's vectorised C++ ``log`` differs from ATen's in the last bit
for some inputs, which would break the bit-identity that keyed decoding rests on, and the
noise is not a CPU engine's bottleneck.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from bubblespec.core.keyed_noise import GOLDEN, MIX1, MIX2, VOCAB_STRIDE

BACKEND_ENV = "BUBBLESPEC_KEYED_BACKEND"
BACKENDS = ("eager", "compiled")
PLACEHOLDER = -1
"""vLLM's placeholder token id in a verification output (positions after a rejection)."""


def i64(x: int) -> int:
    """A uint64 value as the int64 with the same bits."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


_G, _M1, _M2, _VS = (i64(c) for c in (GOLDEN, MIX1, MIX2, VOCAB_STRIDE))


def _lsr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical shift right of int64 bits (uint64 semantics)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser of (z + golden) on int64 tensors, uint64 wrapping (as numpy's)."""
    z = z + _G
    z = (z ^ _lsr(z, 30)) * _M1
    z = (z ^ _lsr(z, 27)) * _M2
    return z ^ _lsr(z, 31)


def position_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[N] int64 keys mix(seed xor mix(position)) of [N] seeds and [N] output positions
    (`keyed_noise.position_key`), on their device."""
    return splitmix64(seeds.long() ^ splitmix64(positions.long()))


def uniforms_of_keys(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, vocab] float64 uniforms u(key_n, v), bit-identical to `keyed_noise.uniforms_of_key`."""
    v = torch.arange(vocab, dtype=torch.long, device=keys.device) * _VS
    z = splitmix64(keys.long().unsqueeze(1) + v.unsqueeze(0))
    return (_lsr(z, 11).double() + 0.5) * (2.0 ** -53)


def keyed_argmax_eager(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[N] int64 argmax(logits + g(key)) per row; logits [N, V] already temperature-scaled
    and masked (-inf outside top-k / top-p). Plain torch ops: the reference twin."""
    g = -torch.log(-torch.log(uniforms_of_keys(keys, logits.shape[-1])))
    return torch.argmax(logits.double() + g, dim=-1)


_compiled: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def keyed_argmax_compiled(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`keyed_argmax_eager` through `torch.compile` (dynamic shapes: one compile for every
    batch and vocabulary): noise and argmax fused, the [N, V] noise never written out."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(keyed_argmax_eager, dynamic=True, fullgraph=True)
    return _compiled(logits, keys)


_agrees: dict[str, bool] = {}


def compiled_agrees(device: torch.device | str, rows: int = 64, vocab: int = 32_003) -> bool:
    """The compiled keyed calls give the eager twins' results bit for bit on a probe step on
    `device` (random logits with masked entries and ties, drafts that partly match; checked
    once per device)."""
    dev = str(torch.device(device))
    if dev not in _agrees:
        _agrees[dev] = _probe(torch.device(device), rows, vocab)
    return _agrees[dev]


def _probe(device: torch.device, rows: int, vocab: int) -> bool:
    gen = torch.Generator().manual_seed(20261206)
    k = 4
    cu = torch.cumsum(torch.randint(0, k + 1, (rows,), generator=gen), 0)
    total = int(cu[-1])
    logits = torch.randn(max(total, rows), vocab, generator=gen) * 4  # sharp: drafts match
    logits[:, ::5] = float("-inf")
    seeds = torch.randint(-(2 ** 63), 2 ** 63 - 1, (rows,), generator=gen)
    n_out = torch.randint(0, 4000, (rows,), generator=gen)
    drafts = logits[:total].argmax(dim=-1)  # the most likely token: often the keyed sample
    logits, seeds, n_out, cu, drafts = (t.to(device) for t in (logits, seeds, n_out, cu, drafts))
    bonus = torch.zeros(rows, 1, dtype=torch.int32, device=device)
    mine = torch.ones(rows, dtype=torch.bool, device=device)
    got = {}
    try:
        for which in ("eager", "compiled"):
            got[which] = (sample_rows(None, logits[:rows], seeds, n_out, None, which=which),
                          verify(None, drafts, cu, logits[:total], bonus, seeds, n_out, mine,
                                 k, which=which))
    except Exception:  # noqa: BLE001 (no compiler for this device: the eager twins serve)
        return False
    return all(torch.equal(a, b) for a, b in zip(got["eager"], got["compiled"]))


def backend(device: torch.device | str) -> str:
    """The keyed-argmax backend for logits on `device` (`BACKEND_ENV`, module docstring)."""
    want = os.environ.get(BACKEND_ENV, "auto")
    if want in BACKENDS:
        return want
    if want != "auto":
        raise ValueError(f"{BACKEND_ENV}={want!r}: choose one of auto, {', '.join(BACKENDS)}")
    if torch.device(device).type != "cuda":
        return "eager"
    return "compiled" if compiled_agrees(device) else "eager"


def keyed_argmax(logits: torch.Tensor, keys: torch.Tensor, which: str | None = None
                 ) -> torch.Tensor:
    """[N] int64 keyed samples of [N, V] logits with [N] keys, by backend `which` (default:
    `backend(logits.device)`)."""
    which = which or backend(logits.device)
    if which == "compiled":
        return keyed_argmax_compiled(logits, keys)
    return keyed_argmax_eager(logits, keys)


def draft_layout(cu_num_draft: torch.Tensor, num_tokens: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row of each drafted token [T], its index within the row [T], drafts per row [R]) of a
    verification step, from vLLM's cumulative draft counts [R] (ends, on the device); T is
    known on the host (the drafted ids' length), so no count is read back."""
    cu = cu_num_draft.long()
    counts = torch.diff(cu, prepend=cu.new_zeros(1))  # [R]
    tok = torch.arange(num_tokens, device=cu.device)  # [T]
    row_of = torch.searchsorted(cu, tok, right=True)  # [T]: rows whose drafts end <= t
    at = tok - (cu - counts).index_select(0, row_of)  # [T]
    return row_of, at, counts


def _with_context(keys: torch.Tensor, ctx_keys: torch.Tensor | None,
                  ctx_mask: torch.Tensor | None) -> torch.Tensor:
    """`keys` with the context keys put in where `ctx_mask` is set (context-keyed rows)."""
    if ctx_keys is None or ctx_mask is None:
        return keys
    return torch.where(ctx_mask, ctx_keys, keys)


def verify_eager(out: torch.Tensor | None, draft_ids: torch.Tensor,
                 cu_num_draft: torch.Tensor, target_logits: torch.Tensor,
                 bonus_ids: torch.Tensor, seeds: torch.Tensor, n_out: torch.Tensor,
                 mine: torch.Tensor, max_spec_len: int, ctx_keys: torch.Tensor | None = None,
                 ctx_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Sample-and-match verification of the rows `mine` [R] bool, batched, keys included.

    draft_ids [T]: the drafted tokens, row after row; cu_num_draft [R]: cumulative drafts per
    row; target_logits [T, V]: the processed logits of the drafted positions; bonus_ids
    [R, 1] or [R]: the sampler's token after all of a row's drafts; seeds, n_out [R]: each
    row's seed bits and next output position (drafted position j of row r is keyed by
    (seeds[r], n_out[r] + j)); ctx_keys / ctx_mask [T]: keys that replace those (context
    keys, computed on the host); out [R, max_spec_len + 1]: vLLM's verification of the other
    rows (None when every row is `mine`). Row r emits its drafts while each equals the keyed
    sample y at its position, then y at the first mismatch, or the bonus token when all
    matched; positions after that hold `PLACEHOLDER`."""
    num_rows, width = cu_num_draft.shape[0], max_spec_len + 1
    device = target_logits.device
    row_of, at, counts = draft_layout(cu_num_draft, draft_ids.shape[0])
    keys = position_keys(seeds.index_select(0, row_of), n_out.index_select(0, row_of) + at)
    ys = keyed_argmax_eager(target_logits, _with_context(keys, ctx_keys, ctx_mask))  # [T]
    # [R, width]: each row's samples at its drafted positions; matched there (0 after)
    flat = row_of * width + at  # [T]
    y_pad = torch.full((num_rows * width,), PLACEHOLDER, dtype=torch.long, device=device)
    y_pad = y_pad.scatter(0, flat, ys).view(num_rows, width)
    hit = torch.zeros(num_rows * width, dtype=torch.int32, device=device)
    hit = hit.scatter(0, flat, (ys == draft_ids.long()).to(torch.int32)).view(num_rows, width)
    accepted = torch.cumprod(hit, dim=1).sum(dim=1)  # [R] leading matches
    j = torch.arange(width, device=device).unsqueeze(0)  # [1, width]
    n, a = counts.unsqueeze(1), accepted.unsqueeze(1)  # [R, 1]
    bonus = bonus_ids.reshape(num_rows, 1).long()
    keyed_out = torch.where((j <= a) & (j < n), y_pad,
                            torch.where((j == n) & (a == n), bonus,
                                        torch.full_like(y_pad, PLACEHOLDER)))
    if out is None:
        return keyed_out.to(torch.int32)
    return torch.where(mine.unsqueeze(1), keyed_out.to(out.dtype), out)


def sample_eager(sampled: torch.Tensor | None, masked: torch.Tensor, seeds: torch.Tensor,
                 positions: torch.Tensor, rows: torch.Tensor | None,
                 ctx_keys: torch.Tensor | None = None, ctx_mask: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Keyed samples of `masked` [N, V] (the keyed rows' processed logits), keyed by
    (seeds, positions) [N] or by `ctx_keys` where `ctx_mask` [N] is set, written into
    `sampled` [R] (vLLM's samples) at `rows` [N]; with `sampled` and `rows` None every row
    is keyed (N = R) and the keyed samples [R] int64 are returned."""
    keys = _with_context(position_keys(seeds, positions), ctx_keys, ctx_mask)
    ys = keyed_argmax_eager(masked, keys)
    if sampled is None or rows is None:
        return ys
    return sampled.index_copy(0, rows, ys.to(sampled.dtype))


_compiled_steps: dict[str, Callable[..., torch.Tensor]] = {}


def _step_fn(name: str, which: str | None, device: torch.device) -> Callable[..., torch.Tensor]:
    eager = {"verify": verify_eager, "sample": sample_eager}[name]
    if (which or backend(device)) != "compiled":
        return eager
    if name not in _compiled_steps:
        _compiled_steps[name] = torch.compile(eager, dynamic=True)
    return _compiled_steps[name]


def verify(out: torch.Tensor | None, draft_ids: torch.Tensor, cu_num_draft: torch.Tensor,
           target_logits: torch.Tensor, bonus_ids: torch.Tensor, seeds: torch.Tensor,
           n_out: torch.Tensor, mine: torch.Tensor, max_spec_len: int,
           ctx_keys: torch.Tensor | None = None, ctx_mask: torch.Tensor | None = None,
           which: str | None = None) -> torch.Tensor:
    """`verify_eager` by backend `which` (default `backend(device)`): one call per step."""
    fn = _step_fn("verify", which, target_logits.device)
    return fn(out, draft_ids, cu_num_draft, target_logits, bonus_ids, seeds, n_out, mine,
              max_spec_len, ctx_keys, ctx_mask)


def sample_rows(sampled: torch.Tensor | None, masked: torch.Tensor, seeds: torch.Tensor,
                positions: torch.Tensor, rows: torch.Tensor | None,
                ctx_keys: torch.Tensor | None = None, ctx_mask: torch.Tensor | None = None,
                which: str | None = None) -> torch.Tensor:
    """`sample_eager` by backend `which` (default `backend(device)`): one call per step."""
    fn = _step_fn("sample", which, masked.device)
    return fn(sampled, masked, seeds, positions, rows, ctx_keys, ctx_mask)


FUSED_STEP_LAUNCHES = 3
"""Kernel launches of one compiled keyed call (stated estimate: the keys, the fused noise and
argmax reduction, the output's epilogue)."""
_eager_launches: dict[str, int] = {}


def launches(name: str, fused: bool) -> int:
    """Kernel launches of one keyed call ("sample" or "verify"): `FUSED_STEP_LAUNCHES` for
    the compiled one; for the eager one the ops it dispatches (views excluded), counted once
    on a small probe (the count does not depend on the sizes)."""
    if fused:
        return FUSED_STEP_LAUNCHES
    if name not in _eager_launches:
        _eager_launches[name] = _count_eager(name)
    return _eager_launches[name]


def _count_eager(name: str) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if not func.is_view:
                self.n += 1  # views launch no kernel
            return func(*args, **(kwargs or {}))

    rows, k, vocab = 3, 2, 16
    z = torch.zeros(rows, dtype=torch.long)
    logits = torch.zeros(rows * k, vocab)
    with Count() as c:
        if name == "verify":
            verify_eager(None, torch.zeros(rows * k, dtype=torch.long),
                         torch.arange(1, rows + 1) * k, logits, z, z, z,
                         torch.ones(rows, dtype=torch.bool), k)
        else:
            sample_eager(None, logits[:rows], z, z, None)
    return c.n
