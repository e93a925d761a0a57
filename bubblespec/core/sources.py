"""Draft sources: the one vocabulary for what a rank drafts from.

A **source** is what the configuration switches on or off (`EngineConfig.sources`, the
rank's ``--sources pregen,siblings,...``, a bench mode's `sources`, the per-mode figures the
simulator reads). Each source feeds one or more **drafters** (`DRAFTER_NAMES`): the
candidates a request is offered at each engine step, one per drafter, among which the one
with the highest calibrated expected accepted length is sent (`core.candidates`,
`core.drafters`). The drafters' names are also those of the per-drafter counters
(``aligned_wins``, ``group_accepted``...).

How each source's tokens reach its drafter (prompt lookup, live sibling outputs, the global
pool's FIFO) is the proposer's business (`engine.proposer`); this module names them once.
Execution options that are not sources (deferring the index appends) are settings of their
own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

SourceName = Literal["pregen", "siblings", "self", "history", "global", "global_live"]


@dataclass(frozen=True)
class Source:
    """One draft source: its name, whether it is on by default, the drafters it feeds and
    what it is."""

    name: SourceName
    default: bool
    feeds: tuple[str, ...]
    doc: str


DRAFTER_NAMES: tuple[str, ...] = ("aligned", "group", "global")
"""The drafters, in tie-break order (an equal expectation goes to the earlier one):
``aligned``, the pre-generated response with the request's own sample index, followed
position by position; ``group``, the prompt group's suffix automaton; ``global``, the
automaton of recent responses to any prompt (vLLM's suffix decoding's global tree)."""

SOURCES: tuple[Source, ...] = (
    Source("pregen", True, ("aligned", "group"),
           "responses pre-generated in an earlier step's bubble (pushed with add_drafts)"),
    Source("siblings", True, ("group",),
           "live and finished sibling responses of the same prompt in the current batch"),
    Source("self", True, ("group",), "the request's own prompt and output (prompt lookup)"),
    Source("history", False, ("group",),
           "responses to the same prompt from earlier batches, kept across batches"),
    Source("global", True, ("global",),
           "recent finished responses to any prompt, one pool under a token budget"),
    Source("global_live", True, ("global",),
           "with global: the responses still being generated are in the pool too (as vLLM's "
           "suffix decoding's global tree); needs siblings"),
)
"""Every source, in the configuration's order."""

SOURCE_NAMES: tuple[str, ...] = tuple(s.name for s in SOURCES)
DEFAULT_SOURCES: tuple[str, ...] = tuple(s.name for s in SOURCES if s.default)
NO_SOURCES_WORDS = ("", "none")
"""What a text setting writes for no source at all."""


def parse_sources(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """The sources named by `value` (a comma-separated text or names), in the canonical
    order, each once; "none", "" or None: no source. Raises ValueError naming an unknown
    source and the known ones."""
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        names = [] if text.lower() in NO_SOURCES_WORDS else [p.strip() for p in text.split(",")]
    else:
        names = [str(p).strip() for p in value]
    bad = [n for n in names if n not in SOURCE_NAMES]
    if bad:
        raise ValueError(f"unknown draft source {bad[0]!r} (known: {', '.join(SOURCE_NAMES)};"
                         " 'none' for no source)")
    return tuple(n for n in SOURCE_NAMES if n in names)


def sources_flag(sources: Iterable[str]) -> str:
    """The rank flag that sets exactly `sources`."""
    names = parse_sources(list(sources))
    return "--sources=" + (",".join(names) if names else "none")


def feeding(drafter: str, sources: Iterable[str]) -> tuple[str, ...]:
    """The sources among `sources` that feed `drafter`."""
    on = set(sources)
    return tuple(s.name for s in SOURCES if s.name in on and drafter in s.feeds)
