"""The engine, run off the event loop.

The engine is CPU work; running it in one worker thread keeps the event loop free for
heartbeats, fetches and /health while an event of 1,000 chunks is assembled. One thread
keeps events in order, and the engine's caches are thread-safe. Events go to it in batches
(`process`): a trip per event cost more than the Kafka path it feeds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from context_assembler.intake.framing import Resolved, schema_id_of
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.records import Handler, HandlerContext, Origin, Outcome
from context_assembler.kafka.runtime.retries import Attempts, Retries
from context_assembler.kafka.schema_registry import OutputIds, RegistryUnavailable, SchemaRegistry
from context_assembler.settings import Settings


class EngineThread:
    """The engine's thread, and what it is given: the handler, policies, framed schemas."""

    def __init__(self, settings: Settings, registry: PolicyRegistry, handler: Handler,
                 schemas: SchemaRegistry | None, retries: Retries) -> None:
        self._handler = handler
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.context = HandlerContext(settings=settings, registry=registry)
        self._schemas = schemas
        if schemas is not None:
            self.context = replace(self.context, schemas={})
        self._retries = retries

    def frame_outputs(self, ids: OutputIds) -> None:
        """Frame prompts and audits with these registered ids from now on."""
        self.context = replace(self.context, prompt_schema_id=ids.prompt,
                               audit_schema_id=ids.audit)

    async def process(
        self, events: Sequence[tuple[bytes, Origin]]
    ) -> list[tuple[Outcome, float]]:
        """The events' outcomes, in order, each with the seconds it took, from one trip to
        the thread. With a schema registry, the schemas the framed events name are fetched
        first."""
        context = self.context
        if self._schemas is not None:
            context = replace(context, schemas=await self._schemas_of(events))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._handle, events, context)

    async def _schemas_of(self, events: Sequence[tuple[bytes, Origin]]) -> dict[int, Resolved]:
        """The schemas the framed events name, from the registry: while it does not answer,
        retried with backoff (reported on /ready), holding these events and so, once
        max-in-flight are held, reading; raises Stopped if the worker stops meanwhile."""
        assert self._schemas is not None
        ids = {schema_id for raw, _ in events if (schema_id := schema_id_of(raw)) is not None}
        if not ids:
            return {}
        attempts = Attempts(self._retries, "read schemas from the schema registry")
        try:
            while True:
                try:
                    return await self._schemas.resolve(ids)
                except RegistryUnavailable as error:
                    await attempts.failed(error)
        finally:
            attempts.close()

    def _handle(
        self, events: Sequence[tuple[bytes, Origin]], context: HandlerContext
    ) -> list[tuple[Outcome, float]]:
        handled = []
        for raw, origin in events:
            started = time.perf_counter()
            outcome = self._handler(raw, origin, context)
            handled.append((outcome, time.perf_counter() - started))
        return handled

    def close(self) -> None:
        self._executor.shutdown(wait=True)
