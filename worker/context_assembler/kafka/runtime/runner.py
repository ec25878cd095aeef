"""One worker's events, whatever the runtime: `EventRunner` composes the jobs each module
here does, and is what the runtimes and the delivery core are handed.

- `engine_thread`: the engine, off the event loop, in batches;
- `telemetry`: metrics, logs, spans, the summary and the lag, and when an event settles;
- `record_sizes`: the topics' limits learned from the broker's refusals;
- `retries`: never giving up on an event while the worker runs, /ready while stuck;
- `sending`: an event's records sent until the broker took them (at_least_once);
- `shutdown`: stopping within the grace period.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from aiokafka.errors import UnsupportedCodecError

from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.records import Handler, Origin, Outcome, handle
from context_assembler.kafka.runtime.engine_thread import EngineThread
from context_assembler.kafka.runtime.record_sizes import RecordSizes
from context_assembler.kafka.runtime.retries import Retries
from context_assembler.kafka.runtime.sending import Sender
from context_assembler.kafka.runtime.shutdown import Shutdown
from context_assembler.kafka.runtime.telemetry import Telemetry
from context_assembler.kafka.schema_registry import OutputIds, SchemaRegistry
from context_assembler.kafka.undecodable import undecodable
from context_assembler.observability.metrics import Metrics
from context_assembler.observability.tracing import Tracing
from context_assembler.settings import Settings

log = logging.getLogger(__name__)


class EventRunner:
    """Runs one worker's events: handled in the engine thread, counted, logged, delivered."""

    def __init__(
        self,
        settings: Settings,
        registry: PolicyRegistry,
        metrics: Metrics,
        handler: Handler = handle,  # the benchmark swaps in a passthrough
        tracing: Tracing | None = None,  # default: from OTEL_EXPORTER_OTLP_ENDPOINT
        schemas: SchemaRegistry | None = None,  # framed events' schemas, if a registry is set
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.shutdown = Shutdown(settings.shutdown_grace_seconds)
        self.stopping = self.shutdown.stopping
        self.telemetry = Telemetry(metrics, settings.group_id, tracing)
        self.retries = Retries(metrics, settings.retry_backoff_max_seconds, self.stopping)
        self.sizes = RecordSizes(settings)
        self.engine = EngineThread(settings, registry, handler, schemas, self.retries)
        self.sender = Sender(self.telemetry, self.retries, self.sizes, self.engine)
        self.undecodable: str | None = None  # why input is no longer read (`cannot_decode`)
        # The jobs' entry points the runtimes use, under the runner's name.
        self.settle = self.telemetry.settle
        self.settling = self.telemetry.settling
        self.watch_lag = self.telemetry.watch_lag
        self.learn = self.sizes.learn
        self.deliver = self.sender.deliver
        self.deliver_all = self.sender.deliver_all
        self.frame_outputs: Callable[[OutputIds], None] = self.engine.frame_outputs
        self.spawn = self.shutdown.spawn
        self.stop = self.shutdown.stop
        self.drained = self.shutdown.drained

    @property
    def blocked(self) -> str | None:
        """Why delivery is stuck until an operator acts, or None; /ready is false meanwhile."""
        return self.undecodable or next(iter(self.retries.stuck.values()), None)

    @property
    def batch_bytes(self) -> int:
        return self.sizes.batch_bytes

    def cannot_decode(self, error: UnsupportedCodecError) -> None:
        """A fetched batch cannot be decoded (a codec library missing): the consumer reads no
        more, so nothing past the batch is handled or committed, and /ready says why until
        an operator installs the codec and restarts the worker. Logged once. Called from
        faust's consumer thread too, so it only sets an attribute and logs."""
        if self.undecodable is None:
            self.undecodable = undecodable(error, self.settings.input_topic)
            log.error("%s; not reading any further until restarted, nothing is committed "
                      "past these records", self.undecodable)

    async def retry_forever(self, what: str, attempt: Callable[[], Awaitable[object]]) -> None:
        """Run `attempt` until it succeeds, or raise Stopped once the worker stops."""
        await self.retries.forever(what, attempt)

    async def process(self, raw: bytes, origin: Origin) -> Outcome:
        """The event's outcome; the event is in flight until `settle`d."""
        return (await self.process_all([(raw, origin)]))[0]

    async def process_all(self, events: Sequence[tuple[bytes, Origin]]) -> list[Outcome]:
        """The events' outcomes, in order, from one trip to the engine thread, within the
        limits learned. Each event is in flight until `settle`d."""
        received_ns = self.telemetry.received_ns()
        handled = await self.engine.process(events)
        learned = self.sizes.learned  # fitting learns nothing
        outcomes = []
        for (raw, origin), (outcome, seconds) in zip(events, handled, strict=True):
            if learned:
                outcome = self.sizes.fit(outcome, raw, origin, self.engine.context)
            self.telemetry.processed(origin, outcome, seconds, received_ns)
            outcomes.append(outcome)
        return outcomes

    def close(self) -> None:
        self.telemetry.summary.flush()
        self.engine.close()
        self.telemetry.tracing.shutdown()
