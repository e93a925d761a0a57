"""The draft store: pre-generated (partial) responses keyed by (step, prompt_key, sample_index),
and beside each its margin branches (keyed by their branch position as well).

Bounded in bytes: a push that would exceed the budget is rejected (the stored version, if any,
stays) rather than evicting another step's or prompt's drafts, so what a rank fetched is never
silently thinned out and a pusher learns at once that more pushes are pointless. Tokens are
kept as `array('i')`, so the accounted bytes are close to the real memory. Drafts of a step go
when the step closes (`drop_through`).
"""

from __future__ import annotations

from array import array
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

from bubblespec.protocol.domain import DraftStatus, PregenDraft, StoreStats

#: Accounted per stored sequence on top of 4 bytes per token and the key's UTF-8 bytes.
SEQUENCE_OVERHEAD_BYTES = 64


def sequence_cost(prompt_key: str, num_tokens: int) -> int:
    """Bytes charged against the budget for one stored sequence."""
    return SEQUENCE_OVERHEAD_BYTES + len(prompt_key.encode()) + 4 * num_tokens


@dataclass
class _Stored:
    tokens: array
    complete: bool
    weight_version: int
    nbytes: int
    records: Sequence[tuple[int, float]] = ()
    """The draft's margin records (running minima of its keyed margins), if pushed."""
    owner: str = ""
    """The rank whose push stored this version (it holds the same bytes if it serves its
    drafts)."""


Slot = tuple[int, int]
"""(sample index, branch position; -1 for the draft itself) within a prompt key."""


def slot_of(d: PregenDraft) -> Slot:
    return d.sample_index, -1 if d.branch_at is None else d.branch_at


class DraftStore:
    """Drafts (and their branches) per step, prompt key and sample index, with a byte
    budget."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = int(budget_bytes)
        self._steps: dict[int, dict[str, dict[Slot, _Stored]]] = {}
        self.bytes = 0
        self.tokens = 0
        self.sequences = 0

    def put(self, step: int, draft: PregenDraft, owner: str = "") -> DraftStatus:
        """Store, replace (offset 0) or extend (offset > 0) one draft, pushed by rank
        `owner`; never raises when full."""
        slot = slot_of(draft)
        samples = self._steps.get(step, {}).get(draft.prompt_key, {})
        old = samples.get(slot)
        old_len = len(old.tokens) if old else 0
        if draft.offset > old_len:
            return DraftStatus.REJECTED_GAP
        new_len = draft.offset + len(draft.token_ids)
        new_bytes = sequence_cost(draft.prompt_key, new_len)
        delta = new_bytes - (old.nbytes if old else 0)
        if delta > 0 and self.bytes + delta > self.budget_bytes:
            return DraftStatus.REJECTED_FULL
        if old is not None and draft.offset > 0:
            del old.tokens[draft.offset :]
            old.tokens.extend(draft.token_ids)
            old.complete, old.weight_version, old.nbytes, old.owner = (
                draft.complete,
                draft.weight_version,
                new_bytes,
                owner if owner == old.owner else "",
            )
            if draft.margin_records:
                old.records = tuple(draft.margin_records)
        else:
            ids = draft.token_ids
            stored = _Stored(ids[:] if isinstance(ids, array) and ids.typecode == "i"
                             else array("i", ids), draft.complete, draft.weight_version,
                             new_bytes, tuple(draft.margin_records), owner)
            prompts = self._steps.setdefault(step, {})
            prompts.setdefault(draft.prompt_key, {})[slot] = stored
            if old is None:
                self.sequences += 1
        self.bytes += delta
        self.tokens += new_len - old_len
        return DraftStatus.STORED

    def tokens_of(self, step: int, prompt_key: str, sample_index: int) -> array | None:
        """The stored draft (not a branch) of one sample, read-only; None if absent."""
        s = self._draft(step, prompt_key, sample_index)
        return None if s is None else s.tokens

    def version_of(self, step: int, prompt_key: str, sample_index: int
                   ) -> tuple[array, bool, int] | None:
        """(tokens, complete, weight version) of one sample's stored draft, the tokens
        read-only; None if absent."""
        s = self._draft(step, prompt_key, sample_index)
        return None if s is None else (s.tokens, s.complete, s.weight_version)

    def branches_of(self, step: int, prompt_key: str, sample_index: int
                    ) -> list[tuple[int, array, bool]]:
        """(branch position, tokens, complete) of one sample's stored margin branches, by
        position, the tokens read-only."""
        samples = self._steps.get(step, {}).get(prompt_key, {})
        return sorted(((at, s.tokens, s.complete) for (i, at), s in samples.items()
                       if i == sample_index and at >= 0), key=lambda b: b[0])

    def records_of(self, step: int, prompt_key: str, sample_index: int
                   ) -> tuple[Sequence[tuple[int, float]], bool] | None:
        """(margin records, complete) of one sample's stored draft; None if absent."""
        s = self._draft(step, prompt_key, sample_index)
        return None if s is None else (s.records, s.complete)

    def _draft(self, step: int, prompt_key: str, sample_index: int) -> _Stored | None:
        return self._steps.get(step, {}).get(prompt_key, {}).get((sample_index, -1))

    def fetch(
        self, step: int, prompt_keys: Iterable[str], max_bytes: int | None = None
    ) -> tuple[list[PregenDraft], bool]:
        """All drafts of the given prompt keys (every sample index, ascending, each draft
        before its branches), in key order.

        Stops before the reply would exceed `max_bytes` (estimated wire size) and then says
        so with `truncated=True`. The returned token arrays are the store's own: read-only.
        """
        drafts, _, _, truncated = self.locate(step, prompt_keys, (), max_bytes)
        return drafts, truncated

    def locate(
        self, step: int, prompt_keys: Iterable[str], serving: Container[str],
        max_bytes: int | None = None,
    ) -> tuple[list[PregenDraft], list[tuple[str, array]], list[str], bool]:
        """`fetch`, except that a draft whose owner is in `serving` (ranks that serve the
        drafts they pushed) is only located: (drafts, located, owners, truncated), where
        `located` holds per prompt key an `array('q')` of six numbers per draft (sample
        index, branch position or -1, length, complete, weight version, owner as an index
        into `owners`), in the order `fetch` gives."""
        prompts = self._steps.get(step, {})
        out: list[PregenDraft] = []
        located: list[tuple[str, array]] = []
        owners: dict[str, int] = {}
        size = 0
        seen: set[str] = set()
        for key in prompt_keys:
            if key in seen:
                continue
            seen.add(key)
            where = array("q")
            for (index, at), s in sorted(prompts.get(key, {}).items()):
                if s.owner and s.owner in serving:
                    size += 48
                    if max_bytes is not None and size > max_bytes:
                        return out, self._with(located, key, where), list(owners), True
                    where.extend((index, at, len(s.tokens), s.complete, s.weight_version,
                                  owners.setdefault(s.owner, len(owners))))
                    continue
                size += s.nbytes + 16
                if max_bytes is not None and size > max_bytes:
                    return out, self._with(located, key, where), list(owners), True
                out.append(PregenDraft(key, index, s.tokens, s.complete, s.weight_version,
                                       branch_at=None if at < 0 else at))
            self._with(located, key, where)
        return out, located, list(owners), False

    @staticmethod
    def _with(located: list[tuple[str, array]], key: str, where: array
              ) -> list[tuple[str, array]]:
        if where:
            located.append((key, where))
        return located

    def discard(self, step: int, prompt_key: str, slot: Slot) -> None:
        """Forget one stored sequence (a draft or a branch), if held."""
        samples = self._steps.get(step, {}).get(prompt_key, {})
        stored = samples.pop(slot, None)
        if stored is not None:
            self.bytes -= stored.nbytes
            self.tokens -= len(stored.tokens)
            self.sequences -= 1

    def drop_through(self, step: int) -> int:
        """Drop the drafts of every step <= `step`; return how many sequences went."""
        dropped = 0
        for s in [s for s in self._steps if s <= step]:
            for samples in self._steps.pop(s).values():
                for stored in samples.values():
                    dropped += 1
                    self.bytes -= stored.nbytes
                    self.tokens -= len(stored.tokens)
        self.sequences -= dropped
        return dropped

    def steps(self) -> list[int]:
        """Steps that currently hold drafts."""
        return sorted(self._steps)

    def stats(self) -> StoreStats:
        """Fill level (sequences, tokens, accounted bytes, budget)."""
        return StoreStats(self.sequences, self.tokens, self.bytes, self.budget_bytes)
