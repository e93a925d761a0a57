"""Pure algorithms of bubblespec (stdlib + numpy only; never torch, vllm, grpc or fastapi).

The draft index: per-prompt-group suffix automata plus a global group
(:class:`SuffixIndex`), incremental per-request matching (:class:`Matcher`), path and tree
drafts (:class:`Draft`, :class:`DraftParams`) and a brute-force reference for tests
(:class:`ReferenceIndex`). Beside it, the forward-time model of a GPU engine
(`engine_time`) that the paced engines and the simulator share.
"""

from bubblespec.core.automaton import SeqCursor, SuffixAutomaton
from bubblespec.core.draft import Draft, DraftParams
from bubblespec.core.matcher import Matcher
from bubblespec.core.reference import ReferenceIndex
from bubblespec.core.suffix_index import SuffixIndex

__all__ = [
    "Draft",
    "DraftParams",
    "Matcher",
    "ReferenceIndex",
    "SeqCursor",
    "SuffixAutomaton",
    "SuffixIndex",
]
