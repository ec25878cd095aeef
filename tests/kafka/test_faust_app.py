"""faust's side of the worker, without a broker."""

from __future__ import annotations

from tests.kafka.test_records import STAMPS
from worker.kafka.faust_app import seconds


def faust_send_ms(timestamp: float | None) -> float | None:
    """What faust's Producer.send makes of the timestamp it is given (its own expression)."""
    return int(timestamp * 1000.0) if timestamp else timestamp


def test_outputs_get_the_inputs_timestamp_to_the_millisecond() -> None:
    for ms in STAMPS:
        sent = faust_send_ms(seconds(ms))
        assert sent == ms and isinstance(sent, int)  # 0 too: faust would pass 0.0 on as is
    assert faust_send_ms(seconds(None)) is None  # the producer stamps it
