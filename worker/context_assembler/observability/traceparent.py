"""The W3C traceparent a request or an event carries: passed on only when it is valid.

Both the HTTP endpoint and the Kafka worker copy a caller's traceparent onto what they
answer; it is untrusted, so only one a tracer would continue is copied, echoed or logged.
No OpenTelemetry import: this runs with tracing off too.
"""

from __future__ import annotations

import re

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


def valid_traceparent(given: str) -> str | None:
    """`given` if it is a W3C traceparent a tracer would continue (not version ff, no
    all-zero id); None otherwise, so a forged one is never echoed, logged or copied."""
    found = _TRACEPARENT.fullmatch(given)
    if found is None:
        return None
    version, trace_id, parent_id = found.groups()
    if version == "ff" or int(trace_id, 16) == 0 or int(parent_id, 16) == 0:
        return None
    return given


def valid_traceparent_header(given: bytes) -> bytes | None:
    """A Kafka header's value, if it is a valid traceparent (`valid_traceparent`)."""
    if not given.isascii():
        return None
    return given if valid_traceparent(given.decode("ascii")) else None
