"""One JSON object per log line; `request_id` and input coordinates ride along as fields."""

from __future__ import annotations

import json
import logging
import sys

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _RESERVED})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class Demoted(logging.Filter):
    """A client's line that says less than the worker's own, shown at DEBUG only."""

    def __init__(self, *texts: str) -> None:
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not any(text in message for text in self.texts):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


# aiokafka's ERROR that the group coordinator is not available, and its WARNING marking it
# dead: every first start of a fresh broker says so while it creates its offsets topic, and
# aiokafka retries; a coordinator that stays away shows on /ready (no partitions assigned).
# A bootstrap server that does not answer: an ERROR every 1-5 s, where the worker's own line
# (context_assembler.kafka.tools.topics.unreachable) names the setting, once.
DEMOTED = {
    "aiokafka.consumer.group_coordinator": ("GroupCoordinatorNotAvailableError",
                                            "Marking the coordinator dead"),
    "aiokafka": ('Unable connect to "',),
}


def configure(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiokafka", "faust", "mode"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    for name, texts in DEMOTED.items():
        client = logging.getLogger(name)
        client.filters[:] = [f for f in client.filters if not isinstance(f, Demoted)]
        client.addFilter(Demoted(*texts))
