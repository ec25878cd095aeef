"""The worker with its old commit cadence: only faust's timer commits, every second (no
commit on delivery, none before a rebalance). `bench.kafka_bench` runs it beside the real
worker to show the duplicates a kill -9 causes, and what committing on delivery costs.
"""

from __future__ import annotations

import sys

from context_assembler.kafka.runtime import faust_app
from context_assembler.kafka.runtime.worker import run_worker
from context_assembler.settings import load_settings

if __name__ == "__main__":
    faust_app.COMMIT_ON_DELIVERY = False
    sys.exit(run_worker(load_settings()))
