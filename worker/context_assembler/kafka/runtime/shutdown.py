"""Stopping within the grace period: retries end at once, work still running after half of
it is cancelled, and the process exits at the end of it whatever is left.

What is cancelled was never acknowledged, so it was never committed: the partition's next
owner redoes it. The hard exit skips leaving the group cleanly: the partitions wait out the
session timeout, which is still safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Shutdown:
    """The worker's cancellable work, and its stop."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self.stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` as a task that stopping may cancel (see `stop`)."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def stop(self) -> None:
        """Stop retrying; cancel spawned work still running after half the grace period;
        exit the process if it is still running after all of it."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        grace = self.grace_seconds
        log.info("stopping: in-flight events have %.0fs to be delivered", grace / 2)
        loop = asyncio.get_running_loop()
        loop.call_later(grace / 2, self._cancel_in_flight)
        loop.call_later(grace, _exit_now, grace)

    def _cancel_in_flight(self) -> None:
        if self._tasks:
            log.warning("%d deliveries still in flight are cancelled; the next owner of their "
                        "partitions redoes those events", len(self._tasks))
        for task in self._tasks:
            task.cancel()

    async def drained(self) -> None:
        """Return once every spawned task has ended: delivered, stopped or cancelled."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))


def _exit_now(grace: float) -> None:
    log.error("still stopping after ASSEMBLER_SHUTDOWN_GRACE_SECONDS=%.0f; exiting now", grace)
    logging.shutdown()
    os._exit(1)
