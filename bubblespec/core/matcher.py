"""Per-request incremental matcher over a group automaton (and the global one).

The matcher keeps, for each automaton, the state ``v`` and length ``l`` of the longest suffix
of the request's context that occurs in the stored sequences, capped at ``max_depth``.
Advancing by one token is the classic suffix-link walk (O(1) amortised): no re-match from the
root per decode step.

Staying exact while the group grows (live siblings being appended): before any answer the
matcher compares the automaton's ``version`` with the one it last saw. If it changed:
1. clones may have split its state: normalise lazily (``while len[link[v]] >= l: v = link[v]``);
2. a longer suffix may now occur. That needs context[-(l+1):] to occur, which (proof in
   ``refresh``) can only happen if ``len[v] == l`` and an append since then walked through
   ``v`` (``touched[v]``). Only then is that one string checked (O(l)) and, if it occurs, the
   match recomputed over the last ``max_depth`` context tokens (O(D), rare).
If the automaton was replaced (rebuild after removal, eviction), the matcher re-matches its last
``max_depth`` context tokens from the root once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from bubblespec.core.automaton import MAX_TOKEN, MULTI, ROOT, SuffixAutomaton, as_tokens
from bubblespec.core.draft import Draft, DraftParams, best_draft

DEFAULT_PARAMS = DraftParams()


def rematch(sam: SuffixAutomaton, ctx: Sequence[int], depth: int) -> tuple[int, int]:
    """Longest match of ``ctx`` computed from the root over its last ``depth`` tokens."""
    return advance(sam, ROOT, 0, list(ctx[-depth:]), depth)


def refresh(sam: SuffixAutomaton, v: int, l: int, ctx: Sequence[int], depth: int,
            since: int) -> tuple[int, int]:
    """Bring a match that was exact at version ``since`` up to date with the automaton.

    If s = ctx[-(l+1):] newly occurs, its one-shorter suffix m (state v) now has an occurrence
    set strictly larger than s's, so s sits in a state whose suffix link is m's state, hence
    ``len[v] == l``; and the append that created the occurrence ended with s, so its
    occurrence-count walk (which covers all its suffixes of length <= D+1) touched ``v``, or
    ``v`` is a clone made after ``since``. Otherwise no longer suffix can occur.
    """
    length, link = sam.length, sam.link
    if l:
        while length[link[v]] >= l:
            v = link[v]
    n = len(ctx)
    if (l < depth and l < n and length[v] == l and sam.touched[v] > since
            and sam.walk(ctx[n - l - 1:]) >= 0):
        v, l = rematch(sam, ctx, depth)
    return v, l


def advance(sam: SuffixAutomaton, v: int, l: int, tokens: list[int], depth: int,
            ptoks: list[int] | None = None, pstates: list[int] | None = None
            ) -> tuple[int, int]:
    """Advance the match (v, l) over ``tokens`` (validated ints).

    ``ptoks``/``pstates``: the path last drafted from (v, l) and its window states. The
    tokens that follow it (the accepted ones) are skipped in one jump; the rest (typically
    the bonus token) is walked with the classic suffix-link loop.
    """
    j = 0
    if ptoks:
        k = len(tokens)
        if k > len(ptoks):  # noqa: PLR1730 (hot path: no builtin call)
            k = len(ptoks)
        if tokens[:k] == ptoks[:k]:
            j = k
        elif tokens[:k - 1] == ptoks[:k - 1]:  # the usual shape: accepted + bonus token
            j = k - 1
        else:
            while tokens[j] == ptoks[j]:
                j += 1
        if j:
            v = pstates[j - 1]
            l += j
            if l > depth:  # noqa: PLR1730
                l = depth
            if j == len(tokens):
                return v, l
    length, link, _, ftok, fto, more = sam.cols
    for i in range(j, len(tokens)):
        c = tokens[i]
        while True:
            f = ftok[v]
            if f == c:
                v = fto[v]
                break
            if f == MULTI:
                t = more[v].get(c, -1)
                if t >= 0:
                    v = t
                    break
            if v == ROOT:
                l = -1
                break
            v = link[v]
            l = length[v]
        if l < depth:
            l += 1
        elif length[link[v]] >= depth:
            v = link[v]
    return v, l


class Matcher:
    """Match state of one request against its group (and the global group).

    Create with :meth:`SuffixIndex.matcher`. Feed every token of the request's context with
    :meth:`extend` (prompt, then accepted and bonus tokens); ask for drafts with :meth:`draft`,
    or do both in one call per decode step with :meth:`speculate`.
    """

    __slots__ = (
        "_ctx",
        "_depth",
        "_get_sam",
        "_gl",
        "_gpstates",
        "_gptoks",
        "_gs",
        "_gsam",
        "_gv",
        "_gver",
        "_l",
        "_pstates",
        "_ptoks",
        "_s",
        "_use_global",
        "_v",
        "_ver",
    )

    def __init__(self, get_sam: Callable[[], SuffixAutomaton],
                 get_global: Callable[[], SuffixAutomaton], depth: int,
                 context: Iterable[int] = (), use_global: bool = True) -> None:
        self._get_sam = get_sam
        self._gsam = get_global
        self._depth = depth
        self._use_global = use_global
        self._ctx: list[int] = []
        self._s = get_sam()
        self._v, self._l, self._ver = ROOT, 0, self._s.version
        self._gs = get_global()
        self._gv, self._gl, self._gver = ROOT, 0, self._gs.version
        self._ptoks = self._pstates = self._gptoks = self._gpstates = None
        self.extend(context)

    # ------------------------------------------------------------------ state
    def _sync(self) -> None:
        """Refresh both match states if their automata changed (see module docstring)."""
        s = self._s
        if s.version != self._ver:
            self._ptoks = None  # the cached path was drafted from the old state
            if s.dead:
                s = self._s = self._get_sam()
                self._v, self._l = rematch(s, self._ctx, self._depth)
            else:
                self._v, self._l = refresh(s, self._v, self._l, self._ctx, self._depth,
                                           self._ver)
            self._ver = s.version
        g = self._gs
        if g.version != self._gver:
            self._gptoks = None
            if g.dead:
                g = self._gs = self._gsam()
                self._gv, self._gl = rematch(g, self._ctx, self._depth)
            else:
                self._gv, self._gl = refresh(g, self._gv, self._gl, self._ctx, self._depth,
                                             self._gver)
            self._gver = g.version

    def extend(self, tokens: Iterable[int]) -> None:
        """Append context tokens (O(1) amortised per token)."""
        if type(tokens) is not list:
            tokens = as_tokens(tokens).tolist()
        else:
            for c in tokens:
                if type(c) is not int or not 0 <= c <= MAX_TOKEN:
                    tokens = as_tokens(tokens).tolist()
                    break
        if not tokens:
            return
        s, g = self._s, self._gs
        if s.version != self._ver or g.version != self._gver:
            self._sync()
            s, g = self._s, self._gs
        depth = self._depth
        self._v, self._l = advance(s, self._v, self._l, tokens, depth, self._ptoks,
                                   self._pstates)
        self._ptoks = None
        if g.occ[ROOT]:  # an empty global group matches nothing: skip it
            self._gv, self._gl = advance(g, self._gv, self._gl, tokens, depth, self._gptoks,
                                         self._gpstates)
        self._gptoks = None
        ctx = self._ctx
        ctx += tokens
        if len(ctx) > 4 * depth:
            del ctx[:-depth]

    def advance(self, token: int) -> None:
        """Append one context token."""
        self.extend([token])

    @property
    def match_len(self) -> int:
        """Length of the longest context suffix (<= max_depth) occurring in the group."""
        self._sync()
        return self._l

    @property
    def global_match_len(self) -> int:
        """Same as :attr:`match_len` for the global group."""
        self._sync()
        return self._gl

    def continuations(self, use_global: bool = False) -> tuple[int, dict[int, int]]:
        """(count of the matched suffix, {token: count of matched suffix + token})."""
        self._sync()
        sam, v = (self._gs, self._gv) if use_global else (self._s, self._v)
        return sam.occ[v], {c: sam.occ[t] for c, t in sam.children(v)}

    # ------------------------------------------------------------------ drafts
    def draft(self, params: DraftParams = DEFAULT_PARAMS) -> Draft:
        """Draft from the current match (see :func:`best_draft`) in the group and in the
        global group: the higher score wins (ties: the group)."""
        if self._s.version != self._ver or self._gs.version != self._gver:
            self._sync()
        # the path drafted from the longest match is kept: accepted tokens that follow it
        # are then skipped without walking (see `advance`)
        toks: list[int] = []
        states: list[int] = []
        best = best_draft(self._s, self._v, self._l, params, toks, states)
        self._ptoks, self._pstates = toks, states
        g = self._gs
        if self._use_global and g.occ[ROOT]:
            gtoks: list[int] = []
            gstates: list[int] = []
            other = best_draft(g, self._gv, self._gl, params, gtoks, gstates)
            self._gptoks, self._gpstates = gtoks, gstates
            if other.score > best.score:
                best = other
        return best

    def speculate(self, new_tokens: Iterable[int],
                  params: DraftParams = DEFAULT_PARAMS) -> Draft:
        """One decode step: append the newly emitted tokens, then draft."""
        self.extend(new_tokens)
        return self.draft(params)
