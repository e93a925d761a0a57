"""The synchronizer's own cost on loopback (figures printed; run with -s to see them).

Full run: `bubblespec bench sync --n 2000`. The bound asserted here is loose
(a shared 2-core CI box): it catches an accidental O(queue) handler or a blocking call, not
noise.
"""

from __future__ import annotations

import json

from bubblespec.bench import sync_latency as bench


def test_poll_and_claim_round_trips_are_sub_millisecond_scale() -> None:
    result = bench.run(n=300)
    print("\nsynchronizer RPC round trips on loopback:\n" + json.dumps(result, indent=2))
    for name in ("PollStop", "ClaimTasks(1)", "ClaimTasks(8)", "PushDrafts(1x256)",
                 "FetchDrafts(8x256)"):
        assert result[name]["p50_us"] < 20_000, (name, result[name])
    assert result["server_handler_mean_us"]["PollStop"] < 1_000
