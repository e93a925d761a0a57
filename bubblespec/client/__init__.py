"""Python client of the bubblespec gateway (sync and async), with typed results.

    from bubblespec.client import BubbleSpecClient
    with BubbleSpecClient("http://127.0.0.1:8000") as c:
        res = c.rollout([[1, 5, 9]], n=4, sampling_params={"temperature": 1.0},
                        next_prompts=[[1, 7, 3]])
        res.prompts[0].samples[2].output_ids

Results are the gateway's own response models (`bubblespec.protocol.gateway`), re-exported
here for convenience.
"""

from __future__ import annotations

from bubblespec.client.client import (
    AsyncBubbleSpecClient,
    BubbleSpecClient,
    BubbleSpecError,
    BubbleSpecUnavailable,
)
from bubblespec.protocol.gateway import (
    PromptResult,
    RankBubble,
    RankEntry,
    RankShard,
    Rerun,
    RolloutCounters,
    RolloutResponse,
    RolloutSample,
    StepReport,
    WeightsResult,
)
from bubblespec.protocol.sampling import PregenWindow, SamplingParams, SeedMode

__all__ = [
    "AsyncBubbleSpecClient", "BubbleSpecClient", "BubbleSpecError", "BubbleSpecUnavailable",
    "PregenWindow", "PromptResult", "RankBubble", "RankEntry", "RankShard", "Rerun",
    "RolloutCounters", "RolloutResponse", "RolloutSample", "SamplingParams", "SeedMode",
    "StepReport", "WeightsResult",
]
