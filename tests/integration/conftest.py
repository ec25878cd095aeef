"""One real broker for the whole integration session, a schema registry for the tests that ask
for one (both from the harness), and the worker processes a test starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.kafka import Broker, running_broker
from harness.registry import Registry, running_registry
from harness.worker import StartWorker, started_workers


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with running_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def running_worker(request: pytest.FixtureRequest, logs: Path) -> Iterator[StartWorker]:
    """Workers on the session's broker unless told another, stopped after the test."""
    with started_workers(lambda: request.getfixturevalue("broker"), logs) as start:
        yield start
