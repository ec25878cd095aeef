"""Record sizes the broker takes, learned from its refusals.

A topic's max.message.bytes may be below ASSEMBLER_MAX_MESSAGE_BYTES: the broker then refuses
a record (or a producer batch) as too large. The limit is learned per topic from the record
refused, and later outcomes are fitted under it (`records.fit`) and producer batches kept
within it.
"""

from __future__ import annotations

import logging

from context_assembler.kafka.records import HandlerContext, Origin, Outcome, OutRecord, fit
from context_assembler.kafka.records import record_size as size_of
from context_assembler.kafka.tuning import PRODUCER_BATCH_BYTES
from context_assembler.settings import MIN_MESSAGE_BYTES, Settings

log = logging.getLogger(__name__)


class RecordSizes:
    """The limits learned, per topic."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._limits: dict[str, int] = {}  # learned from the broker's refusals, per topic

    @property
    def batch_bytes(self) -> int:
        """The producers' batch size: no batch may be larger than a topic takes."""
        return min(PRODUCER_BATCH_BYTES, self._settings.max_message_bytes,
                   *self._limits.values())

    @property
    def learned(self) -> bool:
        return bool(self._limits)

    def fit(self, outcome: Outcome, raw: bytes, origin: Origin,
            context: HandlerContext) -> Outcome:
        """`outcome` within the limits learned (`records.fit`)."""
        return fit(outcome, raw, origin, context, self._limits)

    def learn(self, record: OutRecord) -> bool:
        """The broker refused `record` as too large (its topic's max.message.bytes is below
        max_message_bytes): keep later records for that topic smaller. False if no smaller
        record can stand in for it. A dead letter can be cut further, so its topic's limit
        is halved, to fit in a few rounds; an output cannot, so only its size is excluded."""
        size = size_of(record)
        if record.topic == self._settings.dlq_topic:
            limit = max(size // 2, MIN_MESSAGE_BYTES)
        else:
            limit = size - 1
        if limit >= size:
            return False
        log.warning(
            "%s refused a record of %d bytes: its max.message.bytes is below "
            "ASSEMBLER_MAX_MESSAGE_BYTES=%d; sending it at most %d bytes from now on",
            record.topic, size, self._settings.max_message_bytes, limit,
        )
        self._limits[record.topic] = min(limit, self._limits.get(record.topic, limit))
        return True
