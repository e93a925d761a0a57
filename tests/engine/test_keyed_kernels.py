"""The engine's batched keyed kernels (`engine/keyed_kernels.py`) against the numpy reference,
bit for bit, over drawn shapes (no engine): keys, uniforms, keyed argmax, and the batched
verifier against a row-by-row sample-and-match oracle, with negative controls (a verifier
that accepts one token too many, or reads the wrong position's key, is caught)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bubblespec.core import keyed_noise as ref
from bubblespec.core.context_keys import response_keys
from bubblespec.engine import keyed_kernels as kk


def _keys(values: list[int]) -> torch.Tensor:
    return torch.tensor([kk.i64(int(v)) for v in values], dtype=torch.long)


def test_position_keys_bit_identical() -> None:
    seeds = [0, 1, 2**40 + 3, 2**63 - 1, 2**64 - 1, 123456789]
    positions = [0, 1, 17, 599, 2**31, 5]
    got = kk.position_keys(_keys(seeds), torch.tensor(positions)).tolist()
    want = [kk.i64(int(ref.position_key(s, t))) for s, t in zip(seeds, positions)]
    assert got == want


def test_uniforms_bit_identical() -> None:
    seeds = [0, 1, 2**40 + 3, 2**63 - 1, 123456789]
    positions = [0, 1, 17, 599, 2**31]
    keys = kk.position_keys(_keys(seeds), torch.tensor(positions))
    got = kk.uniforms_of_keys(keys, 257).numpy()
    for i, (s, t) in enumerate(zip(seeds, positions)):
        assert np.array_equal(got[i], ref.uniforms(s, t, 257)), (s, t)


def test_keyed_argmax_matches_reference_sample() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (64, 300))
    seeds = [7919 * i for i in range(64)]
    pos = [i % 11 for i in range(64)]
    keys = kk.position_keys(_keys(seeds), torch.tensor(pos))
    got = kk.keyed_argmax(torch.tensor(logits), keys, "eager").tolist()
    assert got == [ref.keyed_sample(logits[i], seeds[i], pos[i]) for i in range(64)]


def test_context_keyed_argmax_matches_reference_sample() -> None:
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 2, (40, 300))
    out = rng.integers(0, 5, 39).tolist()
    keys = response_keys(77, [1, 2, 3], out)
    got = kk.keyed_argmax(torch.tensor(logits), _keys(keys), "eager").tolist()
    assert got == [ref.keyed_sample_of_key(logits[i], keys[i]) for i in range(40)]


def _oracle(drafts: list[list[int]], logits: np.ndarray, keys: list[int], bonus: list[int],
            width: int, accept_extra: bool = False) -> list[list[int]]:
    """Row-by-row sample-and-match with the numpy reference (what the engine did before the
    batched kernel); `accept_extra` is the negative control: one token past a mismatch."""
    out, t = [], 0
    for r, ds in enumerate(drafts):
        row = [kk.PLACEHOLDER] * width
        j, done = 0, False
        while j < len(ds):
            y = ref.keyed_sample_of_key(logits[t + j], keys[t + j])
            row[j] = y
            if y != ds[j]:
                if accept_extra and j + 1 < len(ds):
                    row[j + 1] = ds[j + 1]
                done = True
                break
            j += 1
        if not done:
            row[len(ds)] = bonus[r]
        out.append(row)
        t += len(ds)
    return out


def _drawn_step(rng: np.random.Generator, rows: int, k: int, vocab: int):
    """A verification step: drafts that follow the keyed samples for a while, then stray."""
    counts = rng.integers(0, k + 1, rows).tolist()
    total = sum(counts)
    logits = rng.normal(0, 1.5, (total, vocab))
    logits[rng.random((total, vocab)) < 0.3] = -np.inf  # masked entries (top-k / top-p)
    logits[np.arange(total), rng.integers(0, vocab, total)] = 0.0  # one finite entry each
    seeds = rng.integers(0, 2**63, rows).tolist()
    n_out = rng.integers(0, 500, rows).tolist()
    keys, drafts, t = [], [], 0
    for r, n in enumerate(counts):
        ds = []
        for j in range(n):
            key = int(ref.position_key(seeds[r], n_out[r] + j))
            keys.append(key)
            y = ref.keyed_sample_of_key(logits[t + j], key)
            ds.append(y if rng.random() < 0.8 else int(rng.integers(0, vocab)))
        drafts.append(ds)
        t += n
    bonus = rng.integers(0, vocab, rows).tolist()
    return counts, logits, seeds, n_out, keys, drafts, bonus


@pytest.mark.parametrize("case", range(12))
def test_batched_verify_equals_row_by_row_oracle(case: int) -> None:
    rng = np.random.default_rng(100 + case)
    rows, k, vocab = int(rng.integers(1, 40)), int(rng.integers(1, 9)), int(rng.integers(2, 600))
    counts, logits, seeds, n_out, keys, drafts, bonus = _drawn_step(rng, rows, k, vocab)
    width = k + 1
    cu = torch.tensor(np.cumsum(counts), dtype=torch.int32)
    flat = torch.tensor([d for ds in drafts for d in ds], dtype=torch.int32)
    row_of, at, got_counts = kk.draft_layout(cu, flat.shape[0])
    assert got_counts.tolist() == counts
    assert row_of.tolist() == [r for r, n in enumerate(counts) for _ in range(n)]
    assert at.tolist() == [j for n in counts for j in range(n)]
    want = _oracle(drafts, logits, keys, bonus, width)
    bonus_t = torch.tensor(bonus, dtype=torch.int32).view(-1, 1)
    seeds_t, n_out_t = _keys(seeds), torch.tensor(n_out)
    got = kk.verify(None, flat, cu, torch.tensor(logits), bonus_t, seeds_t, n_out_t,
                    torch.ones(rows, dtype=torch.bool), k, which="eager")
    assert got.dtype == torch.int32 and got.tolist() == want
    # some rows left to vLLM: its output stands there, untouched
    mine = torch.tensor(rng.random(rows) < 0.5)
    theirs = torch.full((rows, width), 7, dtype=torch.int32)
    mixed = kk.verify(theirs, flat, cu, torch.tensor(logits), bonus_t, seeds_t, n_out_t, mine,
                      k, which="eager").tolist()
    for r in range(rows):
        assert mixed[r] == (want[r] if mine[r] else [7] * width)


def test_verify_with_context_keys() -> None:
    """Keys given per drafted position (context-keyed rows) replace the position keys."""
    rng = np.random.default_rng(9)
    counts, logits, seeds, n_out, _, drafts, bonus = _drawn_step(rng, 10, 5, 40)
    ctx = [int(rng.integers(0, 2**63)) for _ in range(sum(counts))]
    mask = rng.random(sum(counts)) < 0.5
    pos_keys = [int(ref.position_key(seeds[r], n_out[r] + j))
                for r, n in enumerate(counts) for j in range(n)]
    keys = [c if m else p for c, m, p in zip(ctx, mask, pos_keys)]
    got = kk.verify(None, torch.tensor([d for ds in drafts for d in ds]),
                    torch.tensor(np.cumsum(counts)), torch.tensor(logits), torch.tensor(bonus),
                    _keys(seeds), torch.tensor(n_out), torch.ones(10, dtype=torch.bool), 5,
                    _keys(ctx), torch.tensor(mask), which="eager").tolist()
    assert got == _oracle(drafts, logits, keys, bonus, 6)


def test_oracle_negative_controls_are_caught() -> None:
    """The comparison above would see a verifier that keeps one token past a mismatch, or
    that keys each drafted position one position late."""
    rng = np.random.default_rng(7)
    counts, logits, seeds, n_out, keys, drafts, bonus = _drawn_step(rng, 40, 8, 50)
    cu = torch.tensor(np.cumsum(counts))
    flat = torch.tensor([d for ds in drafts for d in ds])
    args = (torch.tensor(logits), torch.tensor(bonus), _keys(seeds))
    mine = torch.ones(40, dtype=torch.bool)
    got = kk.verify(None, flat, cu, *args, torch.tensor(n_out), mine, 8, which="eager").tolist()
    assert got == _oracle(drafts, logits, keys, bonus, 9)
    assert got != _oracle(drafts, logits, keys, bonus, 9, accept_extra=True)
    late = kk.verify(None, flat, cu, *args, torch.tensor(n_out) + 1, mine, 8,
                     which="eager").tolist()
    assert late != got


def test_sample_rows_writes_only_keyed_rows() -> None:
    rng = np.random.default_rng(3)
    logits = torch.tensor(rng.normal(0, 2, (6, 90)))
    seeds, positions = [11, 12, 13], [0, 5, 9]
    rows = torch.tensor([0, 2, 5])
    sampled = torch.full((6,), -3, dtype=torch.long)
    masked = logits.index_select(0, rows)
    got = kk.sample_rows(sampled, masked, _keys(seeds), torch.tensor(positions), rows,
                         which="eager").tolist()
    want = [ref.keyed_sample(logits[r].numpy(), s, t)
            for r, s, t in zip([0, 2, 5], seeds, positions)]
    assert [got[0], got[2], got[5]] == want and [got[1], got[3], got[4]] == [-3, -3, -3]
    every = kk.sample_rows(None, masked, _keys(seeds), torch.tensor(positions), None,
                           which="eager").tolist()
    assert every == want


def test_sampler_bonus_path_equals_verifier_path() -> None:
    """The token the sampler draws at a position (no drafts there) is the token the verifier
    draws at that position as a drafted one: what keeps keyed decoding identical with
    speculation on or off."""
    rng = np.random.default_rng(4)
    logits = torch.tensor(rng.normal(0, 2, (8, 120)))
    seeds, n_out = _keys(rng.integers(0, 2**63, 8).tolist()), torch.tensor(range(8)) * 13
    sampled = kk.sample_rows(None, logits, seeds, n_out, None, which="eager")
    drafted = kk.verify(None, torch.full((8,), -5), torch.arange(1, 9), logits,
                        torch.zeros(8), seeds, n_out, torch.ones(8, dtype=torch.bool), 1,
                        which="eager")
    assert drafted[:, 0].tolist() == sampled.tolist()


def test_eager_launch_counts() -> None:
    """The launches charged for an eager keyed call are the kernels it dispatches; the
    compiled call is charged its stated estimate."""
    assert kk.launches("sample", fused=False) > kk.launches("sample", fused=True)
    assert kk.launches("verify", fused=False) > kk.launches("sample", fused=False)
    assert kk.launches("verify", fused=True) == kk.FUSED_STEP_LAUNCHES


def test_backend_choice(monkeypatch) -> None:
    monkeypatch.delenv(kk.BACKEND_ENV, raising=False)
    assert kk.backend("cpu") == "eager"  # CPU stays on the eager twin (module docstring)
    monkeypatch.setenv(kk.BACKEND_ENV, "compiled")
    assert kk.backend("cpu") == "compiled"
    monkeypatch.setenv(kk.BACKEND_ENV, "fused")
    with pytest.raises(ValueError, match="BUBBLESPEC_KEYED_BACKEND"):
        kk.backend("cpu")


def test_auto_falls_back_when_the_compiled_kernel_disagrees(monkeypatch) -> None:
    """`compiled_agrees` refuses a compiled call that is off by one token anywhere."""
    def off_by_one(*args):
        out = kk.verify_eager(*args)
        return out.index_put((torch.tensor([0]), torch.tensor([0])), out[0, 0] + 1)

    monkeypatch.setattr(kk, "_agrees", {})
    monkeypatch.setattr(kk, "_compiled_steps", {"verify": off_by_one,
                                                "sample": kk.sample_eager})
    assert kk.compiled_agrees("cpu") is False
    monkeypatch.setattr(kk, "_agrees", {})
    monkeypatch.setattr(kk, "_compiled_steps", {"verify": kk.verify_eager,
                                                "sample": kk.sample_eager})
    assert kk.compiled_agrees("cpu") is True
