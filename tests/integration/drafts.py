"""What the synchronizer's draft store holds, read the way a rank fetches drafts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bubblespec.cluster import LocalCluster
from bubblespec.protocol.keys import prompt_key
from bubblespec.synchronizer.client import SyncClient


def complete_draft(cluster: LocalCluster, step: int, prompt: Sequence[int]) -> bool:
    """The synchronizer stores a complete draft of `prompt` (sample 0) for `step`."""

    async def fetch() -> bool:
        async with SyncClient(cluster.sync_address, timeout_s=5.0) as sync:
            drafts = await sync.fetch_drafts(step, [prompt_key(list(prompt))])
        return any(d.complete and d.branch_at is None for d in drafts)

    return asyncio.run(fetch())
