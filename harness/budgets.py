"""Figures a benchmark enforces that the deploy manifests must leave room for."""

from __future__ import annotations

from typing import Final

# `bench.memory_bench` fails if maximum-size events push the worker's RSS past it; the pod's
# memory limit must be above it.
WORKER_RSS_LIMIT_MB: Final = 400.0
