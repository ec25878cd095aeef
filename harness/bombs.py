"""Decompression bombs: one record of a JSON prefix and many spaces, written by librdkafka
compressed with any codec, and the peak resident set of the process that reads it."""

from __future__ import annotations

from harness.codecs import librdkafka_produce
from harness.kafka import Broker

MiB = 1024 * 1024
# What the input topic takes (max.message.bytes) so that a bomb fits compressed: lz4 writes
# 256 MiB of spaces in 1.1 MB, snappy 64 MiB in 3 MB (zstd 256 MiB in 8 KB, gzip in 260 KB).
TOPIC_MAX_MESSAGE_BYTES = 4 * MiB


def bomb(spaces: int) -> bytes:
    """The start of an event, then `spaces` spaces: 'valid' up to where it is cut."""
    return b'{"request_id": "bomb", "question": "' + b" " * spaces


def peak_rss_mib(status: str) -> float:
    """The peak resident set (VmHWM) a /proc/PID/status text gives, in MiB."""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in {status[-2000:]}")


# Run as `python -c MEASURED_MAIN ARGS…`: the CLI with ARGS, then its /proc/self/status on
# stderr (ru_maxrss would count the pages the child had of its parent before exec).
MEASURED_MAIN = ("import sys\n"
                 "from context_assembler.cli.main import main\n"
                 "status = main(sys.argv[1:])\n"
                 "print(open('/proc/self/status').read(), file=sys.stderr)\n"
                 "sys.exit(status)")


def librdkafka_send(broker: Broker, topic: str, codec: str, records: list[tuple[bytes, bytes]]
                    ) -> None:
    """Send `records` compressed with `codec`, flushed: a batch of their own. A record may
    be up to 1 GB before compression, as librdkafka allows."""
    librdkafka_produce(broker, topic, codec, records,
                       {"message.max.bytes": 1_000_000_000, "linger.ms": 5}, timeout=120)
