"""Brute-force reference for the draft index: scans every stored sequence for every query.

Slow (O(stored tokens x string length) per count) and obviously correct; the randomized tests
check :class:`~bubblespec.core.suffix_index.SuffixIndex` against it. It implements the same
definitions (see :mod:`bubblespec.core.draft`) directly on token lists: longest context suffix
of at most ``max_depth`` tokens that occurs, counts of occurrences, greedy path and best-first
tree drafts with the window cut to ``max_depth`` tokens, the best of every match length
(no pruning), group-versus-global choice.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Hashable, Sequence

from bubblespec.core.draft import Draft, DraftParams


class ReferenceIndex:
    """Sequences by group (``None`` is the global group), queried by scanning."""

    def __init__(self, max_depth: int = 64) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.groups: dict[Hashable | None, dict[Hashable, list[int]]] = {}

    def add(self, seq_id: Hashable, group: Hashable | None, tokens: Sequence[int] = (),
            to_global: bool = False) -> None:
        """Store a sequence in ``group`` and, if ``to_global``, in the global group."""
        toks = list(tokens)  # shared by both groups: extend() updates both
        if group is not None:
            self.groups.setdefault(group, {})[seq_id] = toks
        if to_global or group is None:
            self.groups.setdefault(None, {})[seq_id] = toks

    def extend(self, seq_id: Hashable, tokens: Sequence[int]) -> None:
        """Append tokens to a stored sequence (both copies share one list)."""
        for seqs in self.groups.values():
            if seq_id in seqs:
                seqs[seq_id].extend(tokens)
                return
        raise KeyError(seq_id)

    def seqs(self, group: Hashable | None) -> list[list[int]]:
        """The token lists stored in ``group``."""
        return list(self.groups.get(group, {}).values())

    def continuations(self, group: Hashable | None,
                      s: Sequence[int]) -> tuple[int, Counter[int]]:
        """(occurrences of ``s``, Counter of the token following each occurrence)."""
        s = list(s)
        k = len(s)
        total = 0
        nxt: Counter[int] = Counter()
        for seq in self.seqs(group):
            for i in range(len(seq) - k + 1):
                if seq[i:i + k] == s:
                    total += 1
                    if i + k < len(seq):
                        nxt[seq[i + k]] += 1
        return total, nxt

    def count(self, group: Hashable | None, s: Sequence[int]) -> int:
        """Occurrences of ``s`` (empty: every stored token)."""
        if not s:
            return sum(len(q) for q in self.seqs(group))
        return self.continuations(group, s)[0]

    def longest_match(self, group: Hashable | None, ctx: Sequence[int]) -> int:
        """Longest k <= max_depth such that ctx[-k:] occurs in the group."""
        best = 0
        for k in range(1, min(self.max_depth, len(ctx)) + 1):
            if self.count(group, ctx[len(ctx) - k:]) == 0:
                break  # a longer suffix cannot occur if this one does not
            best = k
        return best

    def conditional(self, group: Hashable | None,
                    s: list[int]) -> tuple[int, Counter[int]]:
        """(count of window ``s``, Counter of next tokens): what a draft step divides."""
        total, nxt = self.continuations(group, s)
        if not s:
            total = self.count(group, s)
        return total, nxt

    def path_draft(self, group: Hashable | None, window: Sequence[int], budget: int,
                   params: DraftParams) -> Draft:
        """Greedy most-frequent path (ties: lowest token id) from a matched ``window``."""
        depth = self.max_depth
        s = list(window)
        toks: list[int] = []
        probs: list[float] = []
        prob = 1.0
        while len(toks) < budget:
            total, nxt = self.conditional(group, s)
            if not nxt:
                break
            c = min(nxt, key=lambda t: (-nxt[t], t))
            prob = prob * (nxt[c] / total)
            if prob < params.min_token_prob:
                break
            toks.append(c)
            probs.append(prob)
            s = (s + [c])[-depth:]
        return Draft(toks, list(range(-1, len(toks) - 1)), probs, sum(probs), len(window))

    def tree_draft(self, group: Hashable | None, window: Sequence[int], budget: int,
                   params: DraftParams) -> Draft:
        """Best-first tree under the budget (same tie rules as the index)."""
        depth = self.max_depth
        out = Draft(match_len=len(window))
        heap: list = []
        order = 0

        def expand(s: list[int], prob: float, parent: int) -> None:
            nonlocal order
            total, nxt = self.conditional(group, s)
            for c in sorted(nxt, key=lambda t: (-nxt[t], t)):
                p = prob * (nxt[c] / total)
                if p < params.min_token_prob:
                    break
                heapq.heappush(heap, (-p, order, c, s + [c], parent))
                order += 1

        if budget > 0:
            expand(list(window), 1.0, -1)
        while heap and len(out.token_ids) < budget:
            negp, _, c, s, parent = heapq.heappop(heap)
            out.token_ids.append(c)
            out.parents.append(parent)
            out.probs.append(-negp)
            if len(out.token_ids) < budget:
                expand(s[-depth:], -negp, len(out.token_ids) - 1)
        out.score = sum(out.probs)
        return out

    def group_draft(self, group: Hashable | None, ctx: Sequence[int],
                    params: DraftParams) -> Draft:
        """Draft from the longest match and (``search_shorter``) every shorter one: best
        score, ties to the longer match."""
        make = self.tree_draft if params.use_tree else self.path_draft
        m = self.longest_match(group, ctx)
        best = None
        for k in range(m, 0 if params.search_shorter and m else m - 1, -1):
            window = list(ctx[len(ctx) - k:]) if k else []
            d = make(group, window, params.budget(k), params)
            if best is None or d.score > best.score:
                best = d
        return best

    def draft(self, group: Hashable | None, ctx: Sequence[int], params: DraftParams,
              use_global: bool = True) -> Draft:
        """Group draft, replaced by the global one if that scores strictly higher."""
        best = self.group_draft(group, ctx, params)
        if use_global and group is not None and self.count(None, []):
            other = self.group_draft(None, ctx, params)
            if other.score > best.score:
                best = other
        return best

