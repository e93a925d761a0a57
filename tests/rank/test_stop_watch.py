"""The pre-generation stop watch against a real daemon: the stop comes on the step stream
with no polls while the stream is live; polls are the fallback when it is not."""

from __future__ import annotations

import asyncio

from bubblespec.rank.pregen import StopWatch
from tests.synchronizer.helpers import eventually, make_tasks, serving


async def _asks(watch: StopWatch, n: int) -> None:
    for _ in range(n):  # a lane asking at each decode step
        await watch()
        await asyncio.sleep(0)


def test_no_polls_while_the_stream_is_live_and_the_stop_arrives_on_it() -> None:
    async def main() -> None:
        async with serving() as (_server, c):
            for r in ("r0", "slow"):
                await c.register(r, r)
            await c.open_step(0, {"r0": 1, "slow": 1}, make_tasks(2, 2))
            await c.report_done(0, "r0")
            watch = StopWatch(c, 0, "r0", asyncio.Event(), lambda: 0, poll_every=1)
            watcher = asyncio.create_task(watch.watch())
            await eventually(lambda: watch.streaming)
            await _asks(watch, 200)  # T = 1: 200 polls without the stream
            assert watch.polls == 0 and not watch.fired
            await c.report_done(0, "slow")  # the stop: pushed on the stream
            await asyncio.wait_for(watcher, 5)
            assert watch.fired and watch.polls == 1  # one poll asks the step's window

    asyncio.run(main())


def test_polls_are_the_fallback_when_the_stream_cannot_say() -> None:
    async def main() -> None:
        async with serving() as (_server, c):
            await c.register("r0", "r0")
            # a daemon that does not know the step (restarted without its journal): the
            # stream stays silent, a poll learns the step is over
            watch = StopWatch(c, 3, "r0", asyncio.Event(), lambda: 0, poll_every=4)
            watcher = asyncio.create_task(watch.watch())
            try:
                await _asks(watch, 4)
                await eventually(lambda: watch.polls == 1 and watch.fired)
                assert not watch.streaming
            finally:
                watcher.cancel()

    asyncio.run(main())
