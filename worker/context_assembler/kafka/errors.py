"""What a broker's or a client's error means here, read through aiokafka's error classes.

Admin answers carry numeric error codes per topic; they are compared with the codes of
aiokafka's error classes (`answered`), never with literal numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka.errors import (
    BrokerResponseError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)


def kafka_error(error: BaseException | None) -> KafkaError | None:
    """`error`, or the Kafka error it wraps (faust raises ProducerSendError from it)."""
    while error is not None and not isinstance(error, KafkaError):
        error = error.__cause__
    return error


def too_large(error: BaseException | None) -> bool:
    """Refused for its size, by the producer (before sending) or by the broker: the one test
    of "record too large" both runtimes retry by."""
    return isinstance(kafka_error(error), MessageSizeTooLargeError | RecordListTooLargeError)


def answered(entry: Mapping[str, Any], error: type[BrokerResponseError]) -> bool:
    """Whether an admin answer's entry (a topic described, created) carries `error`'s code;
    `NoError` for success."""
    return bool(entry["error_code"] == error.errno)

