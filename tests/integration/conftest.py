"""One real broker for the whole integration session, a schema registry for the tests that ask
for one (both from the harness), and the worker processes a test starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from harness.kafka import Broker, running_broker
from harness.registry import Registry, running_registry
from harness.worker import Topics, WorkerProcess


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


class StartWorker(Protocol):
    def __call__(self, topics: Topics, guarantee: str = "at_least_once", *,
                 log: str = "worker", env: dict[str, str] | None = None,
                 broker: Broker | None = None, ready: bool = True) -> WorkerProcess: ...


@pytest.fixture
def running_worker(request: pytest.FixtureRequest, logs: Path) -> Iterator[StartWorker]:
    """Starts `context-assembler worker` on `topics` (log in logs/<log>.log), on the session's
    broker unless told another, and by default waits until it is ready. Every worker it
    started is stopped after the test, whatever the test did to it (stopped, killed, left
    running), so a failing test leaves no process behind."""
    started: list[WorkerProcess] = []

    def start(topics: Topics, guarantee: str = "at_least_once", *, log: str = "worker",
              env: dict[str, str] | None = None, broker: Broker | None = None,
              ready: bool = True) -> WorkerProcess:
        worker = WorkerProcess(broker or request.getfixturevalue("broker"), topics,
                               logs / f"{log}.log", guarantee=guarantee, extra_env=env or {})
        started.append(worker.start())
        if ready:
            worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()
