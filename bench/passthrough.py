"""The worker with the engine taken out: the same faust agent, delivery and metrics, but
each input is copied to the prompts and audit topics as is. `bench.kafka_bench` runs it
beside the real worker to show what the engine costs on top of Kafka itself.
"""

from __future__ import annotations

import sys

from context_assembler.kafka.records import HandlerContext, Origin, Outcome, OutRecord
from context_assembler.kafka.runtime.worker import run_worker
from context_assembler.settings import load_settings


def passthrough(raw: bytes, origin: Origin, context: HandlerContext) -> Outcome:
    records = (
        OutRecord(context.settings.prompts_topic, origin.key, raw, ()),
        OutRecord(context.settings.audit_topic, origin.key, raw, ()),
    )
    return Outcome(records, None, None)


if __name__ == "__main__":
    sys.exit(run_worker(load_settings(), handler=passthrough))
