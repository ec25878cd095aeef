"""The worker with the engine taken out: the same faust agent, delivery and metrics, but
each input is copied to the prompts and audit topics as is. `bench.kafka_bench` runs it
beside the real worker to show what the engine costs on top of Kafka itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from worker.codec import Limits
from worker.kafka.records import Origin, Outcome, OutRecord
from worker.kafka.run import run_worker
from worker.policies import PolicyRegistry
from worker.settings import load_settings


def passthrough(
    raw: bytes,
    origin: Origin,
    *,
    registry: PolicyRegistry,
    limits: Limits,
    topics: Sequence[str],
    worker: str,
) -> Outcome:
    prompts_topic, audit_topic, _ = topics
    return Outcome(
        (
            OutRecord(prompts_topic, origin.key, raw, ()),
            OutRecord(audit_topic, origin.key, raw, ()),
        ),
        None,
        None,
    )


if __name__ == "__main__":
    sys.exit(run_worker(load_settings(), handler=passthrough))
