"""The draft index: token sequences grouped by prompt group (plus a global group), each group a
suffix automaton, with a token budget, eviction and removal.

Sequences are added whole or live (then extended token by token until finished). A sequence
may also be mirrored into the global group (``to_global=True``) or live only there
(``group=None``). Requests draft through a :class:`~bubblespec.core.matcher.Matcher`
(incremental, one per request) or one-off through :meth:`SuffixIndex.draft`.

Removal rebuilds each affected automaton from its remaining sequences (in their original
order), so the index answers exactly as one built from the remaining sequences; cost is
O(tokens of the group), paid once per removal call (batch with :meth:`remove_sequences`).
Dropping a whole group (:meth:`remove_group`, eviction) costs nothing.

Eviction, when ``token_budget`` (tokens in keyed groups) is exceeded: whole groups in least-
recently-used order (used = written to, or a matcher/draft created for it), skipping the group
being written and groups holding live sequences; if that is not enough, the oldest finished
sequences of the remaining groups (least recently used first) down to ``low_water`` times the
budget, one rebuild per group. The global group has its own ``global_token_budget`` and drops
its oldest finished sequences down to ``low_water`` times that budget (FIFO, one rebuild).
Live sequences are never evicted, so live data alone may exceed a budget.

Memory: ``compact=False`` (default) keeps automaton columns in lists (fast),
``compact=True`` in ``array('i')`` (smaller, slower); bytes per token: docs/results.md,
"Suffix index vs arctic-inference".

Not thread-safe: use one index per process and call it from one thread (the engine step).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

from bubblespec.core.automaton import SeqCursor, SuffixAutomaton, as_tokens
from bubblespec.core.draft import Draft, DraftParams
from bubblespec.core.matcher import DEFAULT_PARAMS, Matcher, rematch


class _Seq:
    __slots__ = ("cur", "gcur", "key", "live", "seq_id", "tokens")

    def __init__(self, seq_id: Hashable, key: Hashable | None, tokens, live: bool) -> None:
        self.seq_id = seq_id
        self.key = key
        self.tokens = tokens
        self.live = live
        self.cur: SeqCursor | None = None  # set while stored in its keyed group
        self.gcur: SeqCursor | None = None  # set while stored in the global group


class _Group:
    __slots__ = ("key", "nlive", "ntokens", "sam", "seqs")

    def __init__(self, key: Hashable | None, depth: int, compact: bool) -> None:
        self.key = key
        self.sam = SuffixAutomaton(depth, compact)
        self.seqs: dict[Hashable, _Seq] = {}
        self.ntokens = 0
        self.nlive = 0


def _check_hashable(value: object, what: str) -> None:
    try:
        hash(value)
    except TypeError:
        raise ValueError(f"{what} must be hashable, got {value!r}") from None


def _kill(sam: SuffixAutomaton) -> None:
    """Mark an automaton replaced; matchers holding it notice at their next call."""
    sam.dead = True
    sam.version += 1


class SuffixIndex:
    """Per-group suffix automata with a global group, budgets, eviction and removal."""

    def __init__(self, max_depth: int = 64, token_budget: int | None = None,
                 global_token_budget: int | None = None, low_water: float = 0.75,
                 compact: bool = False) -> None:
        if not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
        for name, val in (("token_budget", token_budget),
                          ("global_token_budget", global_token_budget)):
            if val is not None and (not isinstance(val, int) or val < 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {val!r}")
        if not isinstance(low_water, (int, float)) or not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], got {low_water!r}")
        self.max_depth = max_depth
        self.token_budget = token_budget
        self.global_token_budget = global_token_budget
        self.low_water = float(low_water)
        self.compact = bool(compact)
        self._groups: OrderedDict[Hashable, _Group] = OrderedDict()
        self._global = _Group(None, max_depth, self.compact)
        self._seqs: dict[Hashable, _Seq] = {}
        self._ntokens = 0  # tokens in keyed groups

    # ------------------------------------------------------------------ groups
    def _group(self, key: Hashable, create: bool = True) -> _Group | None:
        """The group for ``key`` marked most recently used (created if ``create``)."""
        g = self._groups.get(key)
        if g is not None:
            self._groups.move_to_end(key)
        elif create:
            g = self._groups[key] = _Group(key, self.max_depth, self.compact)
        return g

    def _sam(self, key: Hashable | None) -> SuffixAutomaton:
        """The automaton of ``key`` for a read (an empty one if the group does not exist)."""
        _check_hashable(key, "group")
        if key is None:
            return self._global.sam
        g = self._group(key, create=False)
        return g.sam if g is not None else SuffixAutomaton(self.max_depth, self.compact)

    # ------------------------------------------------------------------ writes
    def add_sequence(self, seq_id: Hashable, group: Hashable | None,
                     tokens: Iterable[int] = (), *, live: bool = False,
                     to_global: bool = False) -> None:
        """Store a sequence in ``group`` (None: global only), mirrored to the global group if
        ``to_global``. ``live`` sequences can be extended until :meth:`finish_sequence`."""
        _check_hashable(seq_id, "seq_id")
        _check_hashable(group, "group")
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists")
        if group is None and not to_global:
            raise ValueError("group=None stores only in the global group: pass to_global=True")
        arr = as_tokens(tokens)
        rec = _Seq(seq_id, group, arr, bool(live))
        g = None
        if group is not None:
            g = self._group(group)
            rec.cur = SeqCursor()
            g.sam.extend(rec.cur, arr)
            g.seqs[seq_id] = rec
            g.ntokens += len(arr)
            g.nlive += rec.live
            self._ntokens += len(arr)
        if to_global:
            rec.gcur = SeqCursor()
            self._global.sam.extend(rec.gcur, arr)
            self._global.seqs[seq_id] = rec
            self._global.ntokens += len(arr)
            self._global.nlive += rec.live
        self._seqs[seq_id] = rec
        self._enforce(g)

    def extend_sequence(self, seq_id: Hashable, tokens: Iterable[int]) -> None:
        """Append tokens to a live sequence (O(1) amortised per token and group)."""
        rec = self._seqs.get(seq_id)
        if rec is None:
            raise ValueError(f"unknown sequence {seq_id!r}")
        if not rec.live:
            raise ValueError(f"sequence {seq_id!r} is finished; only live ones can be extended")
        arr = as_tokens(tokens)
        rec.tokens.extend(arr)
        g = None
        if rec.cur is not None:
            g = self._group(rec.key)
            g.sam.extend(rec.cur, arr)
            g.ntokens += len(arr)
            self._ntokens += len(arr)
        if rec.gcur is not None:
            self._global.sam.extend(rec.gcur, arr)
            self._global.ntokens += len(arr)
        self._enforce(g)

    def extend_sequences(self, seq_ids: Sequence[Hashable],
                         tokens: Sequence[Iterable[int]]) -> None:
        """`extend_sequence(seq_ids[j], tokens[j])` for each j in order, all checked first
        (the native index runs it without the GIL, so a proposer can append a step's
        tokens beside the next forward: `engine.proposer`, ``defer_appends``)."""
        if len(seq_ids) != len(tokens):
            raise ValueError("extend_sequences: one token list per sequence id")
        for sid in seq_ids:
            rec = self._seqs.get(sid)
            if rec is None:
                raise ValueError(f"unknown sequence {sid!r}")
            if not rec.live:
                raise ValueError(f"sequence {sid!r} is finished; only live ones can be extended")
        for sid, toks in zip(seq_ids, tokens):
            self.extend_sequence(sid, toks)

    def finish_sequence(self, seq_id: Hashable) -> None:
        """Mark a live sequence finished (it becomes evictable)."""
        rec = self._seqs.get(seq_id)
        if rec is None:
            raise ValueError(f"unknown sequence {seq_id!r}")
        if rec.live:
            rec.live = False
            if rec.cur is not None:
                self._groups[rec.key].nlive -= 1
            if rec.gcur is not None:
                self._global.nlive -= 1

    def remove_sequence(self, seq_id: Hashable) -> None:
        """Remove one sequence (see :meth:`remove_sequences`)."""
        self.remove_sequences([seq_id])

    def remove_sequences(self, seq_ids: Iterable[Hashable]) -> None:
        """Remove sequences from their group and the global group; each affected automaton is
        rebuilt once from its remaining sequences (dropped if none remain)."""
        ids = list(seq_ids)
        for sid in ids:
            if sid not in self._seqs:
                raise ValueError(f"unknown sequence {sid!r}")
        touched: dict[int, _Group] = {}
        for sid in dict.fromkeys(ids):
            rec = self._seqs.pop(sid)
            if rec.cur is not None:
                g = self._groups[rec.key]
                self._detach(g, rec)
                touched[id(g)] = g
            if rec.gcur is not None:
                self._detach(self._global, rec)
                touched[id(self._global)] = self._global
        for g in touched.values():
            self._rebuild(g)

    def remove_group(self, group: Hashable) -> None:
        """Remove every sequence of ``group`` (their global mirrors too)."""
        g = self._groups.get(group)
        if g is None:
            raise ValueError(f"unknown group {group!r}")
        self.remove_sequences(list(g.seqs))
        g = self._groups.get(group)
        if g is not None:  # an empty group (e.g. made by a matcher) goes too
            self._drop_group(g)

    # ------------------------------------------------------------------ internals
    def _detach(self, g: _Group, rec: _Seq) -> None:
        """Take ``rec`` out of ``g``'s bookkeeping (the automaton is rebuilt by the caller)."""
        del g.seqs[rec.seq_id]
        n = len(rec.tokens)
        g.ntokens -= n
        g.nlive -= rec.live
        if g is self._global:
            rec.gcur = None
        else:
            rec.cur = None
            self._ntokens -= n
        if rec.cur is None and rec.gcur is None:
            self._seqs.pop(rec.seq_id, None)

    def _rebuild(self, g: _Group) -> None:
        """Replace ``g``'s automaton by one built from its remaining sequences."""
        _kill(g.sam)
        if not g.seqs and g is not self._global:
            del self._groups[g.key]
            return
        sam = g.sam = SuffixAutomaton(self.max_depth, self.compact)
        is_global = g is self._global
        for rec in g.seqs.values():
            cur = SeqCursor()
            sam.extend(cur, rec.tokens)
            if is_global:
                rec.gcur = cur
            else:
                rec.cur = cur

    def _drop_group(self, g: _Group) -> None:
        for rec in list(g.seqs.values()):
            self._detach(g, rec)
        _kill(g.sam)
        del self._groups[g.key]

    def _evict_oldest(self, g: _Group, target: int, total: int) -> int:
        """Drop ``g``'s oldest finished sequences until ``total`` <= ``target``; rebuild."""
        dropped = False
        for rec in list(g.seqs.values()):
            if total <= target:
                break
            if not rec.live:
                total -= len(rec.tokens)
                self._detach(g, rec)
                dropped = True
        if dropped:
            self._rebuild(g)
        return total

    def _enforce(self, current: _Group | None) -> None:
        """Apply both budgets after a write to ``current``."""
        budget = self.token_budget
        if budget is not None and self._ntokens > budget:
            for g in list(self._groups.values()):
                if self._ntokens <= budget:
                    break
                if g is not current and g.nlive == 0:
                    self._drop_group(g)
            if self._ntokens > budget:
                target = int(budget * self.low_water)
                for g in list(self._groups.values()):
                    if self._ntokens <= target:
                        break
                    total = self._ntokens
                    self._evict_oldest(g, target + g.ntokens - total, g.ntokens)
        gb = self.global_token_budget
        if gb is not None and self._global.ntokens > gb:
            self._evict_oldest(self._global, int(gb * self.low_water), self._global.ntokens)

    # ------------------------------------------------------------------ reads
    def matcher(self, group: Hashable | None, context: Iterable[int] = (), *,
                use_global: bool = True) -> Matcher:
        """An incremental matcher for a request of ``group`` (None: global only), fed with
        ``context`` (e.g. the prompt)."""
        if group is None:
            get = lambda: self._global.sam
        else:
            _check_hashable(group, "group")
            self._group(group)
            get = lambda: self._group(group).sam
        return Matcher(get, lambda: self._global.sam, self.max_depth, context,
                       use_global and group is not None)

    def draft(self, group: Hashable | None, context: Iterable[int],
              params: DraftParams = DEFAULT_PARAMS, *, use_global: bool = True) -> Draft:
        """One-off draft for ``context`` without keeping a matcher (O(max_depth))."""
        g = self._sam(group)
        ctx = as_tokens(context).tolist()[-self.max_depth:]  # the match needs no more
        m = Matcher(lambda: g, lambda: self._global.sam, self.max_depth, ctx,
                    use_global and group is not None)
        return m.draft(params)

    def longest_match(self, group: Hashable | None, context: Iterable[int]) -> int:
        """Length of the longest suffix of ``context`` (<= max_depth) occurring in ``group``."""
        ctx = list(as_tokens(context))
        return rematch(self._sam(group), ctx, self.max_depth)[1]

    def count(self, group: Hashable | None, tokens: Iterable[int]) -> int:
        """Occurrences of ``tokens`` (<= max_depth + 1 of them) in ``group``'s sequences."""
        return self._sam(group).count(list(as_tokens(tokens)))

    def groups(self) -> list[Hashable]:
        """Keys of the stored groups, least recently used first."""
        return list(self._groups)

    def sequence_ids(self, group: Hashable | None) -> list[Hashable]:
        """Ids of the sequences stored in ``group`` (None: the global group), oldest first."""
        g = self._global if group is None else self._groups.get(group)
        return [] if g is None else list(g.seqs)

    def sequence_tokens(self, seq_id: Hashable) -> list[int]:
        """The tokens of a stored sequence."""
        rec = self._seqs.get(seq_id)
        if rec is None:
            raise ValueError(f"unknown sequence {seq_id!r}")
        return rec.tokens.tolist()

    @property
    def num_tokens(self) -> int:
        """Tokens stored in keyed groups (what ``token_budget`` bounds)."""
        return self._ntokens

    @property
    def num_global_tokens(self) -> int:
        """Tokens stored in the global group."""
        return self._global.ntokens

    def nbytes(self) -> int:
        """Approximate bytes held: automata plus stored token arrays."""
        total = self._global.sam.nbytes() + sum(g.sam.nbytes() for g in self._groups.values())
        return total + sum(sys.getsizeof(r.tokens) + 120 for r in self._seqs.values())
