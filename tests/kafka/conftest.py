"""What the runner and delivery-core tests share: a runner on fake topics, a caught hard exit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.runtime import shutdown
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Calls of the hard exit, which must never end the test process."""
    calls: list[float] = []
    monkeypatch.setattr(shutdown, "_exit_now", calls.append)
    yield calls


def make_runner(**settings: object) -> EventRunner:
    """A runner with its topics named and retries quick; `settings` override either."""
    values: dict[str, object] = {"prompts_topic": "prompts", "audit_topic": "audit",
                                 "dlq_topic": "dlq", "retry_backoff_max_seconds": 0.05,
                                 **settings}
    return EventRunner(Settings.model_validate(values), PolicyRegistry(Policy()), Metrics())
