"""Noise keys of context-keyed sampling: the key of each output position from the preceding
tokens, made unique within a response (the reference; the engine uses this very code).

Position-keyed noise (`keyed_noise.position_key`) couples a pre-generated response to the
new one only while both stay at the same positions: one inserted or deleted token shifts
every later position's noise, and the coupling is lost for the rest of the response.
Context keying re-couples after such a shift: the key of output position t is

    key_t = K(seed, h(c_t), j_t)

with c_t the last `CONTEXT_LEN` tokens before t (prompt included; fewer at the start of a
short sequence), h a 64-bit hash of them, and j_t the smallest j >= 0 such that
K(seed, h(c_t), j) was not used at an earlier position of the same response. Without hash
collisions j_t is the number of earlier positions of the response with the same context:
(context, occurrence) pairs. A response that re-joins the draft's contexts after a local
edit draws the same noise again, so it is coupled again.

Exactness: key_t is a function of the seed and the tokens before t, and by construction it
differs from every key used earlier in the response, even when two contexts' hashes
collide (the "first unused j" rule, not a count of contexts). The uniforms of a key
(`keyed_noise.uniforms_of_key`) are those of a counter-based generator never queried at
that key before, so - under the same model of SplitMix64 as a random function that makes
position keying exact - the noise at t is independent of everything sampled so far, and
Gumbel-max draws token t exactly from the processed distribution. A key made of the context
alone (no occurrence index) reuses noise whenever a context repeats; the exactness tests
keep such a key as their negative control (`context_only_key`).
"""

from __future__ import annotations

from collections.abc import Sequence

from bubblespec.core.keyed_noise import GOLDEN, M64, MIX1, MIX2

CONTEXT_LEN = 4
"""Tokens of preceding context a key depends on: after an edit, noise re-couples once this
many tokens again equal the draft's (a shorter context re-couples sooner but repeats more
often, which only raises the occurrence index)."""
_OCCURRENCE_STRIDE = 0xA0761D6478BD642F
_CONTEXT_SALT = 0xE7037ED1A0B428DB


def mix64(z: int) -> int:
    """SplitMix64 finaliser of (z + golden) on Python ints (same bits as the numpy one)."""
    z = (z + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * MIX1) & M64
    z = ((z ^ (z >> 27)) * MIX2) & M64
    return z ^ (z >> 31)


def context_hash(context: Sequence[int]) -> int:
    """64-bit hash of the last `CONTEXT_LEN` tokens of `context` (and how many there are)."""
    tail = context[-CONTEXT_LEN:] if CONTEXT_LEN else ()
    h = mix64(_CONTEXT_SALT ^ len(tail))
    for tok in tail:
        h = mix64(h ^ (int(tok) & M64))
    return h


def candidate_key(seed: int, h: int, j: int) -> int:
    """K(seed, h, j): the j-th candidate key of context hash h."""
    return mix64(mix64((seed & M64) ^ h) ^ ((j * _OCCURRENCE_STRIDE) & M64))


def context_only_key(seed: int, context: Sequence[int]) -> int:
    """NEGATIVE CONTROL ONLY: the key without the occurrence index. It reuses noise whenever
    a context repeats within a response, so its samples are biased; tests must catch it."""
    return candidate_key(seed, context_hash(context), 0)


def next_key(seed: int, context: Sequence[int], *used: set[int]) -> int:
    """key_t for the position after `context`, given the keys used earlier in the response
    (one or more sets)."""
    h = context_hash(context)
    j = 0
    key = candidate_key(seed, h, j)
    while any(key in u for u in used):
        j += 1
        key = candidate_key(seed, h, j)
    return key


def _context_only_next(seed: int, context: Sequence[int], *used: set[int]) -> int:
    """`next_key` of the negative control (`ResponseKeys(..., fault_context_only=True)`)."""
    return context_only_key(seed, context)


def response_keys(seed: int, prompt: Sequence[int], output: Sequence[int],
                  extra: int = 1) -> list[int]:
    """Keys of output positions 0 .. len(output) - 1 + extra (each from the tokens before it)."""
    seq = [*prompt[-CONTEXT_LEN:], *output]
    off = len(seq) - len(output)
    used: set[int] = set()
    keys = []
    for t in range(len(output) + extra):
        key = next_key(seed, seq[max(0, off + t - CONTEXT_LEN):off + t], used)
        used.add(key)
        keys.append(key)
    return keys


class ResponseKeys:
    """Keys of one response as it grows; extended lazily from committed tokens.

    The engine calls `sync` with the newly committed tokens before each sampling step, then
    `lookahead` for the next position and the drafted ones (each drafted position keyed as
    if every earlier draft token were accepted - which is exactly when its sample is used).
    """

    def __init__(self, seed: int, num_prompt: int, fault_context_only: bool = False) -> None:
        self.seed = seed
        self.num_prompt = num_prompt
        self._next = _context_only_next if fault_context_only else next_key
        self.keys: list[int] = []
        self.used: set[int] = set()

    def sync_start(self) -> int:
        """Index of the first sequence token `sync` needs (earlier ones are keyed)."""
        return max(0, self.num_prompt + len(self.keys) - CONTEXT_LEN)

    def sync(self, tokens: Sequence[int], n_tokens: int) -> None:
        """Add the keys of committed output positions not yet keyed. `tokens` is the
        sequence (prompt + committed output) from index `sync_start()` on, `n_tokens` the
        committed sequence's full length."""
        start = self.sync_start()
        for t in range(len(self.keys), n_tokens - self.num_prompt):
            end = self.num_prompt + t
            key = self._next(self.seed, tokens[max(0, end - CONTEXT_LEN) - start:end - start],
                           self.used)
            self.used.add(key)
            self.keys.append(key)

    def lookahead(self, tail: Sequence[int], drafts: Sequence[int], count: int) -> list[int]:
        """Keys of the next `count` positions: the first after `tail` (the last committed
        tokens, at least `CONTEXT_LEN` of them where the sequence has them), the later ones
        after `drafts[:i]`. Does not change the state."""
        if count - 1 > len(drafts):
            raise ValueError(f"{count} positions need {count - 1} drafted tokens")
        head = list(tail[-CONTEXT_LEN:]) if CONTEXT_LEN else []
        seq = [*head, *drafts[:count - 1]]
        extra: set[int] = set()
        out = []
        for i in range(count):
            end = len(head) + i
            key = self._next(self.seed, seq[max(0, end - CONTEXT_LEN):end], self.used, extra)
            extra.add(key)
            out.append(key)
        return out
