"""Keyed Gumbel noise: the reference definition (numpy) of bubblespec's keyed sampling.

A token at output position t of a request with seed s is sampled as
    argmax_v( logits_v / T + g(s, t, v) ),  g = -log(-log(u(s, t, v)))
with top-k / top-p applied to the logits first (masked entries are -inf). u comes from a
counter-based generator (SplitMix64), so it depends only on (s, t, v): the same response
is sampled whether or not speculation is on, whatever the batch, and a response
pre-generated with the same seed by slightly older weights is a coupled prediction of the
new one. Each position uses fresh, independent noise, so every token is an exact sample
of the target distribution. The engine's torch version must match this bit for bit.
Context-keyed sampling (`seed_mode: keyed_context`) draws the same way from the uniforms of
a key derived from the preceding tokens instead of the position (`context_keys`).
"""

from __future__ import annotations

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
VOCAB_STRIDE = 0xD1B54A32D192ED03


def splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser of (z + golden), elementwise on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        z = z.astype(np.uint64) + np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        return z ^ (z >> np.uint64(31))


def position_key(seed: int, position: int) -> np.uint64:
    """Key of (seed, output position): mix(seed xor mix(position))."""
    pos = splitmix64(np.array([position % (1 << 64)], dtype=np.uint64))
    return splitmix64(np.array([seed % (1 << 64)], dtype=np.uint64) ^ pos)[0]


def uniforms_of_key(key: int | np.uint64, vocab: int) -> np.ndarray:
    """u(key, v) in (0, 1) for v in [0, vocab), float64 (53 random bits)."""
    k = np.uint64(int(key) % (1 << 64))
    with np.errstate(over="ignore"):
        z = splitmix64(k + np.arange(vocab, dtype=np.uint64) * np.uint64(VOCAB_STRIDE))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * (2.0 ** -53)


def uniforms(seed: int, position: int, vocab: int) -> np.ndarray:
    """u(s, t, v): the uniforms of the position key of (s, t)."""
    return uniforms_of_key(position_key(seed, position), vocab)


def gumbel(seed: int, position: int, vocab: int) -> np.ndarray:
    """Standard Gumbel noise g(s, t, v)."""
    return -np.log(-np.log(uniforms(seed, position, vocab)))


def keyed_sample(logits: np.ndarray, seed: int, position: int, temperature: float = 1.0,
                 top_k: int = -1, top_p: float = 1.0) -> int:
    """Reference keyed sample of one position (temperature 0: argmax)."""
    return keyed_sample_of_key(logits, position_key(seed, position), temperature, top_k, top_p)


def keyed_sample_of_key(logits: np.ndarray, key: int | np.uint64, temperature: float = 1.0,
                        top_k: int = -1, top_p: float = 1.0) -> int:
    """Reference keyed sample with the noise of `key` (a position key, or a context key of
    `context_keys`); temperature 0: argmax."""
    x = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        return int(np.argmax(x))
    x = x / temperature
    if top_k > 0 and top_k < x.size:
        kth = np.sort(x)[-top_k]
        x = np.where(x < kth, -np.inf, x)
    if top_p < 1.0:
        order = np.argsort(-x, kind="stable")
        p = np.exp(x[order] - x[order[0]])
        p /= p.sum()
        keep = np.cumsum(p) - p < top_p
        mask = np.full(x.size, True)
        mask[order[keep]] = False
        x = np.where(mask, -np.inf, x)
    return int(np.argmax(x - np.log(-np.log(uniforms_of_key(key, x.size)))))


def keyed_top2(logits: np.ndarray, key: int | np.uint64,
               temperature: float = 1.0) -> tuple[int, float, int]:
    """(token, margin, runner-up) of a keyed sample without top-k / top-p: the token is
    `keyed_sample_of_key`'s, the runner-up the token with the second-highest perturbed score
    logits / T + g, and the margin the gap between the two (>= 0). A small margin is where a
    slightly changed policy is likely to pick another token with the same noise, and the
    runner-up is then its most likely pick: what margin branching pre-generates."""
    x = np.asarray(logits, dtype=np.float64) / temperature
    s = x - np.log(-np.log(uniforms_of_key(key, x.size)))
    a = int(np.argmax(s))
    best = s[a]
    s[a] = -np.inf
    b = int(np.argmax(s))
    return a, float(best - s[b]), b


def gumbel_of(key: int | np.uint64, token_ids: np.ndarray | list[int]) -> np.ndarray:
    """g(key, v) for the given token ids only: the values `uniforms_of_key` gives them."""
    k = np.uint64(int(key) % (1 << 64))
    ids = np.asarray(token_ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = splitmix64(k + ids * np.uint64(VOCAB_STRIDE))
    return -np.log(-np.log(((z >> np.uint64(11)).astype(np.float64) + 0.5) * (2.0 ** -53)))


def keyed_margin(top: dict[int, float], token: int, key: int | np.uint64,
                 temperature: float = 1.0) -> tuple[float, int]:
    """(margin, runner-up) of the keyed sample `token` among the tokens of `top` ({token
    id: log-probability}, e.g. an engine's top log-probs, which must hold `token`): the
    perturbed score logprob / T + g of `token` minus the best other one in `top`. Tokens
    outside `top` are not seen, so this bounds the full-vocabulary margin (`keyed_top2`)
    from above; it is a drafting heuristic only. (inf, -1) when `top` has no other token."""
    others = [t for t in top if t != token]
    if not others:
        return float("inf"), -1
    ids = [token, *others]
    s = np.asarray([top[t] for t in ids]) / temperature + gumbel_of(key, ids)
    j = 1 + int(np.argmax(s[1:]))
    return float(s[0] - s[j]), int(ids[j])
