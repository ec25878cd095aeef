"""Static group membership: the consumer of either delivery path joins with the replica's
group.instance.id, and without one it stays a dynamic member."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.group_coordinator import GroupCoordinator

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka import clients
from context_assembler.kafka.runtime import transactional
from context_assembler.kafka.runtime.faust_app import _ConsumerThread, build_app
from context_assembler.kafka.runtime.membership import leave_on_stop
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.tuning import HEARTBEAT_INTERVAL_SECONDS
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings


def settings(**values: Any) -> Settings:
    return Settings.model_validate({"bootstrap_servers": "127.0.0.1:1", **values})


def runner(config: Settings) -> EventRunner:
    return EventRunner(config, PolicyRegistry(Policy()), Metrics())


@pytest.mark.parametrize("instance", ["replica-0", None])
async def test_the_faust_consumer_joins_with_the_instance_id(tmp_path: Path,
                                                             instance: str | None) -> None:
    config = settings(group_instance_id=instance)
    app = build_app(config, runner(config), str(tmp_path))
    thread = app.consumer._thread  # type: ignore[attr-defined]  # owns the aiokafka consumer
    consumer = thread._create_worker_consumer(app.consumer.transport)
    assert isinstance(consumer, AIOKafkaConsumer)
    assert consumer._group_instance_id == instance
    assert consumer._session_timeout_ms == int(config.session_timeout_seconds * 1000)
    assert consumer._heartbeat_interval_ms == HEARTBEAT_INTERVAL_SECONDS * 1000
    assert isinstance(thread, _ConsumerThread)  # the one that leaves the group when stopped


class Built(Exception):
    """Raised by the stand-in consumer once it has its arguments."""


@pytest.mark.parametrize("instance", ["replica-0", None])
async def test_the_transactional_consumer_joins_with_the_instance_id(
    monkeypatch: pytest.MonkeyPatch, instance: str | None
) -> None:
    seen: dict[str, Any] = {}

    def consumer(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise Built

    monkeypatch.setattr(clients, "AIOKafkaConsumer", consumer)
    config = settings(group_instance_id=instance, processing_guarantee="exactly_once")
    with pytest.raises(Built):
        await transactional.TransactionalWorker(config, runner(config)).run()
    assert seen["group_instance_id"] == instance
    assert seen["group_id"] == config.group_id
    assert seen["heartbeat_interval_ms"] == HEARTBEAT_INTERVAL_SECONDS * 1000


async def test_a_static_member_stopped_on_purpose_sends_leave_group() -> None:
    consumer = AIOKafkaConsumer(group_id="g", group_instance_id="replica-0",
                                bootstrap_servers="127.0.0.1:1")
    sent: list[object] = []

    async def send(request: object) -> None:
        sent.append(request)

    class Joined:  # what _maybe_leave_group reads of a coordinator that has joined
        generation = 3
        member_id = "member-3"
        group_id = "g"
        _send_req = staticmethod(send)

        def reset_generation(self) -> None:
            self.generation = -1

    joined = Joined()
    joined._group_instance_id = "replica-0"  # type: ignore[attr-defined]
    await GroupCoordinator._maybe_leave_group(joined)
    assert sent == []  # aiokafka on its own: a static member never leaves
    joined.generation = 3
    consumer._coordinator = joined
    leave_on_stop(consumer)
    await GroupCoordinator._maybe_leave_group(joined)
    assert [(r._group, r._member_id) for r in sent] == [("g", "member-3")]  # type: ignore[attr-defined]


def test_the_instance_id_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSEMBLER_GROUP_INSTANCE_ID", "assembler-2")
    assert Settings().group_instance_id == "assembler-2"
    monkeypatch.setenv("ASSEMBLER_GROUP_INSTANCE_ID", " ")
    assert Settings().group_instance_id is None  # empty: a dynamic member
