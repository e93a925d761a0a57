"""Online generalized suffix automaton over token-id sequences (one per prompt group).

Why an automaton and not a suffix tree: appending a token costs O(1) amortised (a suffix tree
truncated at depth D, as in arctic-inference, touches up to D active nodes per token), and a
request's match state (state, matched length) advances by one token in O(1) amortised instead
of re-matching its context from the root at every decode step.

Layout: states are rows of int columns (length, suffix link, occurrence count, last-touched
version, and the out-transition when there is exactly one: ``ftok[v]`` token, ``fto[v]``
target). ``ftok[v]`` is ``NONE`` without transitions and ``MULTI`` with two or more, which then
live in a dict ``more[v]`` (token -> target); on RL-like text few states branch.
The columns are Python lists by default (CPython indexes a list faster than an
``array('i')``) or, with ``compact=True``, ``array('i')`` (fewer bytes per token, slower
inserts and drafts); bytes per token and times: docs/results.md, "Suffix index vs
arctic-inference". No Python object per state either way.

Occurrence counts: ``occ[v]`` is the number of end positions (endpos size) of the strings of
state ``v`` over all stored sequences. It is maintained on append by walking the suffix-link
chain from a per-sequence cursor that holds the sequence's suffix of length ``max_depth + 1``,
so an append costs O(number of distinct endpos classes among its last D+1 suffixes), bounded
by D+1 even for degenerate repetitive text. Consequently ``occ`` is exact for every state whose
shortest string has at most ``max_depth + 1`` tokens, which covers everything the matcher and
the drafters read (they keep their windows at most ``max_depth`` long). For the root, ``occ``
is the number of stored tokens.
"""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Iterable

ROOT = 0
NONE = -1  # ftok value: no out-transition
MULTI = -2  # ftok value: two or more out-transitions, all in ``more[v]``
MAX_TOKEN = 2**31 - 1


def _int_array(values: list[int]) -> array:
    return array("i", values)


def as_token(c: object) -> int:
    """Validate one token id (any integral type, 0 <= c < 2**31); ValueError otherwise."""
    try:
        t = operator.index(c)
    except TypeError:
        raise ValueError(f"token ids must be integers, got {c!r}") from None
    if not 0 <= t <= MAX_TOKEN:
        raise ValueError(f"token ids must be in [0, 2**31), got {t}")
    return t


def as_tokens(tokens: Iterable[object]) -> array:
    """Validate a token sequence into an ``array('i')``; ValueError on a bad id."""
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()  # numpy arrays: one C-level conversion
    elif not isinstance(tokens, (list, tuple, array)):
        tokens = list(tokens)
    try:
        arr = array("i", tokens)
    except (TypeError, OverflowError):
        arr = array("i", [as_token(c) for c in tokens])
    if arr and min(arr) < 0:
        raise ValueError(f"token ids must be >= 0, got {min(arr)}")
    return arr


class SeqCursor:
    """Append position of one sequence in one automaton.

    ``last``: state of the whole sequence so far (needed to extend the automaton);
    ``cu``/``cl``: state and length of the sequence's suffix of length min(n, D+1) (needed to
    update occurrence counts in bounded time).
    """

    __slots__ = ("cl", "cu", "last")

    def __init__(self) -> None:
        self.last = ROOT
        self.cu = ROOT
        self.cl = 0


class SuffixAutomaton:
    """Generalized suffix automaton with bounded-depth occurrence counts.

    Append-only: removal is done by the owner rebuilding from the remaining sequences.
    ``version`` increases by one per appended token, so readers can tell that it changed;
    ``dead`` is set when the owner replaces the automaton (rebuild, eviction).
    """

    __slots__ = ("best", "cols", "compact", "dead", "fto", "ftok", "length", "link",
                 "max_depth", "more", "occ", "touched", "version")

    def __init__(self, max_depth: int, compact: bool = False) -> None:
        if not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be a positive int, got {max_depth!r}")
        self.max_depth = max_depth
        self.compact = bool(compact)
        col = _int_array if compact else list
        self.length = col([0])
        self.link = col([-1])
        self.occ = col([0])
        self.ftok = col([NONE])
        self.fto = col([0])
        self.touched = col([0])  # last append that walked through the state (see matcher)
        self.more: dict[int, dict[int, int]] = {}
        # (length, link, occ, ftok, fto, more): one attribute load for the hot loops
        self.cols = (self.length, self.link, self.occ, self.ftok, self.fto, self.more)
        # most frequent child of high-fanout states: v -> (version, token, target, count)
        self.best: dict[int, tuple[int, int, int, int]] = {}
        self.version = 0
        self.dead = False

    # ------------------------------------------------------------------ queries
    @property
    def num_states(self) -> int:
        """Number of states, root included."""
        return len(self.length)

    @property
    def num_tokens(self) -> int:
        """Number of tokens appended so far (the root's occurrence count)."""
        return self.occ[ROOT]

    def go(self, v: int, c: int) -> int:
        """Target of the transition from ``v`` on token ``c``, or -1 if there is none."""
        f = self.ftok[v]
        if f == c:
            return self.fto[v]
        if f == MULTI:
            return self.more[v].get(c, -1)
        return -1

    def children(self, v: int) -> list[tuple[int, int]]:
        """Out-transitions of ``v`` as (token, target) pairs, unordered."""
        f = self.ftok[v]
        if f == MULTI:
            return list(self.more[v].items())
        return [] if f == NONE else [(f, self.fto[v])]

    def walk(self, tokens: Iterable[int]) -> int:
        """State reached by reading ``tokens`` from the root, or -1 if they never occur."""
        v = ROOT
        ftok, fto, more = self.ftok, self.fto, self.more
        for c in tokens:
            f = ftok[v]
            if f == c:
                v = fto[v]
            elif f == MULTI:
                v = more[v].get(c, -1)
                if v < 0:
                    return -1
            else:
                return -1
        return v

    def count(self, tokens: list[int]) -> int:
        """Occurrences of ``tokens`` (a string of at most max_depth + 1 tokens) as a substring
        of the stored sequences; the empty string counts every stored token."""
        if len(tokens) > self.max_depth + 1:
            raise ValueError(f"count() needs at most max_depth + 1 = {self.max_depth + 1} "
                             f"tokens, got {len(tokens)}")
        v = self.walk(tokens)
        return 0 if v < 0 else self.occ[v]

    def nbytes(self) -> int:
        """Estimated bytes held: columns, transition dicts and the int objects they own.

        Ints in [-5, 256] are shared by CPython. In list mode each state owns about three int
        objects (its id, referenced from transitions and links; its length; its token);
        counts above 256 are rare and ignored. Cross-checked with tracemalloc by the bench.
        """
        int_size = sys.getsizeof(1 << 20)
        n = len(self.length)
        total = sys.getsizeof(self) + sys.getsizeof(self.more) + sys.getsizeof(self.touched)
        total += sys.getsizeof(self.best) + 120 * len(self.best)
        for col in (self.length, self.link, self.occ, self.ftok, self.fto):
            total += sys.getsizeof(col)
        if not self.compact:  # + one version object per appended token (``touched``)
            total += int_size * (n + self.occ[ROOT] + sum(1 for x in self.length if x > 256)
                                 + sum(1 for x in self.ftok if x > 256))
        for d in self.more.values():
            total += sys.getsizeof(d) + int_size * sum(1 for c in d if c > 256)
            if self.compact:
                total += int_size * len(d)  # targets are fresh objects when read from arrays
        return total

    # ------------------------------------------------------------------ updates
    def _clone(self, q: int, p: int, c: int, new_len: int, ver: int) -> int:
        """Split state ``q``: a clone of length ``new_len`` takes the shorter strings, and
        transitions on ``c`` into ``q`` from ``p`` and its suffix links move to the clone."""
        length, link, ftok, fto, more = self.length, self.link, self.ftok, self.fto, self.more
        clone = len(length)
        length.append(new_len)
        link.append(link[q])
        self.occ.append(self.occ[q])
        ftok.append(ftok[q])
        fto.append(fto[q])
        self.touched.append(ver)
        if ftok[q] == MULTI:
            more[clone] = dict(more[q])
        link[q] = clone
        while p >= 0:  # every suffix link of p has a transition on c
            if ftok[p] == c:
                if fto[p] != q:
                    break
                fto[p] = clone
            else:
                m = more[p]
                if m[c] != q:
                    break
                m[c] = clone
            p = link[p]
        return clone

    def extend(self, cur: SeqCursor, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to the sequence whose append position is ``cur``.

        O(1) amortised per token for the automaton, plus the bounded occurrence-count walk.
        Tokens must be validated ints in [0, 2**31) (the index does it).
        """
        length, link, occ, ftok, fto, more, touched = (
            self.length, self.link, self.occ, self.ftok, self.fto, self.more, self.touched)
        d1 = self.max_depth + 1
        last, cu, cl = cur.last, cur.cu, cur.cl
        ver = self.version
        clone = self._clone
        for c in tokens:
            ver += 1
            # 1. automaton: extend `last` by c (generalized: the transition may exist).
            f = ftok[last]
            if f == c:
                q = fto[last]
            elif f == MULTI:
                q = more[last].get(c, -1)
            else:
                q = -1
            if q >= 0:
                if length[q] != length[last] + 1:
                    q = clone(q, last, c, length[last] + 1, ver)
                last = q
            else:
                new = len(length)
                length.append(length[last] + 1)
                link.append(ROOT)
                occ.append(0)
                ftok.append(NONE)
                fto.append(0)
                touched.append(ver)
                p = last
                while p >= 0:
                    f = ftok[p]
                    if f == c:
                        q = fto[p]
                        break
                    if f == NONE:
                        ftok[p] = c
                        fto[p] = new
                    elif f == MULTI:
                        m = more[p]
                        q = m.get(c, -1)
                        if q >= 0:
                            break
                        m[c] = new
                    else:
                        more[p] = {f: fto[p], c: new}
                        ftok[p] = MULTI
                    p = link[p]
                if p >= 0:
                    lp = length[p] + 1
                    if lp == length[q]:
                        link[new] = q
                    else:  # split q: inlined copy of _clone (the hot case on RL-like text)
                        k = len(length)
                        length.append(lp)
                        link.append(link[q])
                        occ.append(occ[q])
                        f = ftok[q]
                        ftok.append(f)
                        fto.append(fto[q])
                        touched.append(ver)
                        if f == MULTI:
                            more[k] = more[q].copy()
                        link[q] = link[new] = k
                        while p >= 0:
                            if ftok[p] == c:
                                if fto[p] != q:
                                    break
                                fto[p] = k
                            else:
                                m = more[p]
                                if m[c] != q:
                                    break
                                m[c] = k
                            p = link[p]
                last = new
            # 2. cursor: suffix of length min(n, D+1), lazily normalised after clones.
            if cl:
                while length[link[cu]] >= cl:
                    cu = link[cu]
            cu = fto[cu] if ftok[cu] == c else more[cu][c]
            cl += 1
            if cl > d1:
                cl = d1
                while length[link[cu]] >= d1:
                    cu = link[cu]
            # 3. occurrence counts of every suffix of length <= D+1 grow by one.
            x = cu
            while x >= 0:
                occ[x] += 1
                touched[x] = ver
                x = link[x]
        self.version = ver
        cur.last, cur.cu, cur.cl = last, cu, cl
