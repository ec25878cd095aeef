"""Shared by both delivery paths: run the engine off the event loop, count, log, retry.

The engine is CPU work; running it in one worker thread keeps the event loop free for
heartbeats, fetches and /health while an event of 1,000 chunks is assembled. One thread
keeps events in order, and the engine's caches are thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from worker.kafka.records import Handler, HandlerContext, Origin, Outcome, handle
from worker.observability.metrics import Metrics
from worker.policies import PolicyRegistry
from worker.settings import Settings

log = logging.getLogger("context_assembler.worker")


class EventPipeline:
    def __init__(
        self,
        settings: Settings,
        registry: PolicyRegistry,
        metrics: Metrics,
        handler: Handler = handle,  # the benchmark swaps in a passthrough
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._handler = handler
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._context = HandlerContext(
            registry, settings.limits, settings.prompts_topic, settings.audit_topic,
            settings.dlq_topic, settings.group_id,
        )

    def _handle(self, raw: bytes, origin: Origin) -> tuple[Outcome, float]:
        started = time.perf_counter()
        outcome = self._handler(raw, origin, self._context)
        return outcome, time.perf_counter() - started

    async def process(self, raw: bytes, origin: Origin) -> Outcome:
        loop = asyncio.get_running_loop()
        outcome, seconds = await loop.run_in_executor(self._executor, self._handle, raw, origin)
        self.metrics.observe(outcome, seconds)
        if outcome.rejected is not None:
            log.warning(
                "rejected input: %s", outcome.rejected.message,
                extra={"request_id": outcome.rejected.request_id, "origin": str(origin),
                       "reason": outcome.rejected.reason},
            )
        elif outcome.assembly is not None:
            audit = outcome.assembly.audit
            log.debug(
                "assembled", extra={"request_id": audit.request_id, "origin": str(origin),
                                    "kept": len(audit.kept), "dropped": len(audit.dropped),
                                    "tokens": audit.tokens.prompt},
            )
        return outcome

    async def retry_forever(self, what: str, attempt: Callable[[], Awaitable[None]]) -> None:
        """Deliver or keep trying: giving up would mean acking an unanswered event."""
        delay = 0.1
        while True:
            try:
                await attempt()
                return
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.metrics.retries.inc()
                log.warning("%s failed, retrying in %.1fs: %r", what, delay, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_backoff_max_seconds)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
