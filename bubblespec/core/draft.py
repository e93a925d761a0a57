"""Draft format, draft parameters and the two drafters (path and tree) over an automaton.

Both drafters start from a matched window: a state ``v`` and a length ``l`` (the longest
suffix of the request's context that occurs in the group, at most ``max_depth`` tokens). The
conditional probability of token ``c`` after window ``s`` is count(s + c) / count(s), counts
being occurrences in the stored sequences (count(empty) = number of stored tokens, so a window
that ends a stored sequence lowers the probability of every continuation, as in
SuffixDecoding). After a drafted token the window is s + c, cut to its last ``max_depth``
tokens: drafts are not limited to ``max_depth - match_len`` tokens, unlike a depth-D tree.

Draft length: ``max_tokens = min(max_spec_tokens, int(l * max_spec_factor + max_spec_offset))``;
a token is drafted only if its path probability is at least ``min_token_prob``;
``score`` is the sum of the path probabilities (expected accepted tokens under the counts).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from bubblespec.core.automaton import NONE, SuffixAutomaton


@dataclass(slots=True)
class Draft:
    """A draft: a path (``parents[i] == i - 1``) or a tree of tokens.

    ``parents[i]`` is the index of token i's parent in ``token_ids`` (-1: child of the
    matched context); ``probs[i]`` its path probability; ``score`` the sum of ``probs``;
    ``match_len`` the matched context length the draft was made from.
    """

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class DraftParams:
    """Draft shape, with SuffixDecoding's meaning for each knob."""

    max_spec_tokens: int = 16
    """Hard cap on drafted tokens (tree: node budget)."""
    max_spec_factor: float = 1.0
    """Tokens allowed per matched context token."""
    max_spec_offset: float = 0.0
    """Tokens allowed on top of ``max_spec_factor * match_len`` (may be negative)."""
    min_token_prob: float = 0.1
    """Minimum path probability of a drafted token."""
    use_tree: bool = False
    """Tree draft (best-first under the budget) instead of a single path."""
    search_shorter: bool = True
    """Also draft from shorter context matches and keep the best score (ties: the longer
    match), as SuffixDecoding does: a long match can be over-specific (it drops siblings
    that had an edit inside the window, or matches only the request's own live output).
    One candidate per distinct occurrence set (suffix link), pruned by exact score bounds:
    1.3 path drafts per step on the RL bench, 2.4 when the request's output is live."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_spec_tokens, int) or self.max_spec_tokens < 0:
            raise ValueError(f"max_spec_tokens must be an int >= 0, got {self.max_spec_tokens!r}")
        for name in ("max_spec_factor", "max_spec_offset", "min_token_prob"):
            val = getattr(self, name)
            if not isinstance(val, (int, float)) or not math.isfinite(val):
                raise ValueError(f"{name} must be a finite number, got {val!r}")
        if self.max_spec_factor < 0:
            raise ValueError(f"max_spec_factor must be >= 0, got {self.max_spec_factor!r}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob!r}")
        object.__setattr__(self, "_fast", (
            self.max_spec_tokens, float(self.max_spec_factor), float(self.max_spec_offset),
            float(self.min_token_prob), bool(self.use_tree), bool(self.search_shorter)))

    def budget(self, match_len: int) -> int:
        """Number of tokens a draft from a match of ``match_len`` tokens may have."""
        n = int(match_len * self.max_spec_factor + self.max_spec_offset + 1e-6)
        return max(0, min(self.max_spec_tokens, n))


_NPP = 256
_PATH_PARENTS = list(range(-1, _NPP - 1))  # parents of a path draft: a slice of this


def _best_child(d: dict[int, int], occ) -> tuple[int, int, int]:
    """(token, target, count) of the most frequent transition in ``d``, ties by token id."""
    bc, bt, bk = -1, -1, -1
    for c, t in d.items():
        k = occ[t]
        if k > bk or (k == bk and c < bc):
            bc, bt, bk = c, t, k
    return bc, bt, bk


def best_child(sam: SuffixAutomaton, v: int) -> tuple[int, int, int]:
    """Most frequent child of a branching state; memoised per automaton version for states
    with many children (the root and common tokens), which arctic keeps sorted instead."""
    d = sam.more[v]
    if len(d) <= 8:
        return _best_child(d, sam.occ)
    e = sam.best.get(v)
    if e is not None and e[0] == sam.version:
        return e[1], e[2], e[3]
    c, t, k = _best_child(d, sam.occ)
    sam.best[v] = (sam.version, c, t, k)
    return c, t, k


def _path(toks: list[int], probs: list[float]) -> Draft:
    n = len(toks)
    parents = _PATH_PARENTS[:n] if n <= _NPP else list(range(-1, n - 1))
    return Draft(toks, parents, probs, sum(probs), 0)


def path_draft(sam: SuffixAutomaton, v: int, l: int, max_tokens: int,
               min_prob: float, states: list[int] | None = None,
               beat: float = -1.0) -> Draft | None:
    """Greedy path: at each step the most frequent continuation (ties: lowest token id).

    If ``states`` is given, the window state after each drafted token is appended to it (the
    matcher reuses them to advance over accepted tokens without walking again). With
    ``beat >= 0``, returns None as soon as the score provably cannot exceed ``beat`` (later
    path probabilities never exceed the current one).
    """
    toks: list[int] = []
    probs: list[float] = []
    if max_tokens <= 0:
        return _path(toks, probs)
    length, link, occ, ftok, fto, _ = sam.cols
    depth = sam.max_depth
    if states is None:
        states = []
    prob = 1.0
    tot = occ[v]
    room = depth - l  # drafted tokens before the window reaches `depth` tokens
    for i in range(max_tokens):
        c = ftok[v]
        if c >= 0:
            t = fto[v]
            cnt = occ[t]
        elif c == NONE:
            break
        else:
            c, t, cnt = best_child(sam, v)
        if cnt != tot:
            prob = prob * (cnt / tot)
            if prob < min_prob:
                break
            if beat >= 0.0 and sum(probs) + prob * (max_tokens - i) < beat - 1e-9:
                return None
        toks.append(c)
        probs.append(prob)
        # The window grows by c; past `depth` tokens it drops its first token: one suffix
        # link at most, taken iff the link's strings are still `depth` tokens long.
        if i >= room and length[link[t]] >= depth:
            t = link[t]
            tot = occ[t]
        else:
            tot = cnt
        v = t
        states.append(t)
    return _path(toks, probs)


def tree_draft(sam: SuffixAutomaton, v: int, l: int, max_tokens: int,
               min_prob: float) -> Draft:
    """Best-first token tree: the ``max_tokens`` nodes of highest path probability (at least
    ``min_prob``), children of a node distinct; ties are taken in push order (parents before
    children, siblings by count then token id)."""
    length, link, occ, _, _, _ = sam.cols
    depth = sam.max_depth
    toks: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list[tuple[float, int, int, int, int, int]] = []
    order = 0

    def expand(v: int, l: int, prob: float, parent: int) -> None:
        nonlocal order
        total = occ[v]
        kids = sam.children(v)
        if len(kids) > 8 and min_prob > 0.0:  # high fanout: sort only the likely ones
            floor = min_prob * total / prob * (1.0 - 1e-9)
            kids = [(c, t) for c, t in kids if occ[t] >= floor]
        kids = sorted(((occ[t], c, t) for c, t in kids), key=lambda k: (-k[0], k[1]))
        for cnt, c, t in kids:
            p = prob * (cnt / total)
            if p < min_prob:
                break  # children are sorted by count: the rest are smaller
            heapq.heappush(heap, (-p, order, c, t, l + 1, parent))
            order += 1

    if max_tokens > 0:
        expand(v, l, 1.0, -1)
    while heap and len(toks) < max_tokens:
        negp, _, c, t, tl, parent = heapq.heappop(heap)
        idx = len(toks)
        toks.append(c)
        parents.append(parent)
        probs.append(-negp)
        if tl > depth:
            tl = depth
            while length[link[t]] >= depth:
                t = link[t]
        if idx + 1 < max_tokens:
            expand(t, tl, -negp, idx)
    return Draft(toks, parents, probs, sum(probs), 0)


def best_draft(sam: SuffixAutomaton, v: int, l: int, params: DraftParams,
               path_toks: list[int] | None = None,
               states: list[int] | None = None) -> Draft:
    """Draft from the longest match (v, l) and, with ``params.search_shorter``, from each
    shorter match of a different occurrence set (the suffix-link ancestors of ``v``, at their
    full length): the highest score wins, ties go to the longer match.

    Within one occurrence set the longest length always wins (same counts, largest budget),
    so the ancestors are the only candidates; a candidate whose budget, or first-token
    probability times budget, cannot beat the best score is skipped (exact pruning: the
    score is a sum of at most ``budget`` path probabilities, none above the first one).
    For path drafts, ``path_toks`` and ``states`` receive the tokens and window states of
    the path drafted from (v, l), whichever draft wins.
    """
    cap, factor, offset, minp, tree, shorter = params._fast
    n = int(l * factor + offset + 1e-6)  # same expression as DraftParams.budget
    if n > cap:  # noqa: PLR1730 (hot path: no builtin call)
        n = cap
    if tree:
        best = tree_draft(sam, v, l, n, minp)
    else:
        best = path_draft(sam, v, l, n, minp, states)
        if path_toks is not None:
            path_toks += best.token_ids
    best.match_len = l
    if not shorter:
        return best
    length, link, occ, ftok, fto, _ = sam.cols
    u = link[v]
    while u > 0:
        lu = length[u]
        n = int(lu * factor + offset + 1e-6)
        if n > cap:  # noqa: PLR1730
            n = cap
        score = best.score
        if n <= score:
            break  # budgets only shrink further up the chain
        f = ftok[u]
        if f >= 0:
            first = occ[fto[u]]
        elif f == NONE:
            first = 0
        else:
            first = best_child(sam, u)[2]
        # skip a candidate whose first token is already below min_prob (empty draft), or
        # whose bound is clearly below (float sums may sit an ulp above the exact bound)
        if first / occ[u] >= minp and first * n > score * occ[u] * (1.0 - 1e-9):
            if tree:
                d = tree_draft(sam, u, lu, n, minp)
            else:
                d = path_draft(sam, u, lu, n, minp, None, score)
            if d is not None and d.score > score:
                d.match_len = lu
                best = d
        u = link[u]
    return best
