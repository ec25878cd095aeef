"""One real broker for the whole integration session (scripts/kafka.sh), and a schema registry
for the tests that ask for one (scripts/registry.sh)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import Broker, running_broker
from tests.support.registry import SchemaRegistryProcess, running_registry


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with running_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistryProcess]:
    with running_registry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path
