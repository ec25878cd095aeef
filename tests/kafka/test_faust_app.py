"""faust's side of the worker, without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from faust.assignor.client_assignment import CopartitionedAssignment
from faust.assignor.copartitioned_assignor import CopartitionedAssignor
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembler.engine.policy import Policy
from context_assembler.intake.policies import PolicyRegistry
from context_assembler.kafka.faust_app import (
    COMMIT_GAP_SECONDS,
    _commit_delivered,
    _next_batch,
    build_app,
    seconds,
)
from context_assembler.kafka.runner import ENGINE_BATCH, EventRunner
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings
from tests.kafka.test_records import STAMPS


def faust_send_ms(timestamp: float | None) -> float | None:
    """What faust's Producer.send makes of the timestamp it is given (its own expression)."""
    return int(timestamp * 1000.0) if timestamp else timestamp


def test_outputs_get_the_inputs_timestamp_to_the_millisecond() -> None:
    for ms in STAMPS:
        sent = faust_send_ms(seconds(ms))
        assert sent == ms and isinstance(sent, int)  # 0 too: faust would pass 0.0 on as is
    assert faust_send_ms(seconds(None)) is None  # the producer stamps it


class GatedConsumer:
    """A consumer whose commits end when the test says so."""

    def __init__(self) -> None:
        self.started = 0
        self.gate = asyncio.Event()

    async def commit(self) -> bool:
        self.started += 1
        await self.gate.wait()
        self.gate.clear()
        return True


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(1):
        while not condition():
            await asyncio.sleep(0.005)


async def test_acks_during_a_commit_are_committed_by_one_more_commit() -> None:
    consumer = GatedConsumer()
    app = SimpleNamespace(consumer=consumer)
    acked, stopping = asyncio.Event(), asyncio.Event()
    commits = asyncio.create_task(_commit_delivered(app, acked, stopping))  # type: ignore[arg-type]
    acked.set()
    await until(lambda: consumer.started == 1)
    for _ in range(3):  # acks while the commit is in progress: one commit later takes them all
        acked.set()
        await asyncio.sleep(0.01)
    assert consumer.started == 1  # one commit at a time
    consumer.gate.set()
    await until(lambda: consumer.started == 2)
    consumer.gate.set()
    await asyncio.sleep(COMMIT_GAP_SECONDS + 0.05)
    assert consumer.started == 2  # nothing acked since: no commit
    stopping.set()
    acked.set()  # from now on the last commit is the stopping worker's
    await asyncio.wait_for(commits, 1)
    assert consumer.started == 2


async def test_a_commit_in_progress_survives_the_agent_being_cancelled() -> None:
    consumer = GatedConsumer()
    app = SimpleNamespace(consumer=consumer)
    acked = asyncio.Event()
    commits = asyncio.create_task(_commit_delivered(app, acked, asyncio.Event()))  # type: ignore[arg-type]
    acked.set()
    await until(lambda: consumer.started == 1)
    inner = next(t for t in asyncio.all_tasks() if t is not commits
                 and t is not asyncio.current_task())
    commits.cancel()
    await asyncio.sleep(0.01)
    assert commits.cancelled() and not inner.done()  # faust's books stay whole
    consumer.gate.set()
    await asyncio.wait_for(inner, 1)


async def next_batch(arrived: asyncio.Queue[Any]) -> Any:
    return await _next_batch(arrived)


async def test_a_batch_is_what_arrived_meanwhile_up_to_its_size_and_none_once_reading_ends() -> None:
    arrived: asyncio.Queue[Any] = asyncio.Queue()
    for n in range(ENGINE_BATCH + 3):
        arrived.put_nowait(n)
    assert await next_batch(arrived) == list(range(ENGINE_BATCH))
    assert await next_batch(arrived) == [ENGINE_BATCH, ENGINE_BATCH + 1, ENGINE_BATCH + 2]
    waiting = asyncio.create_task(next_batch(arrived))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # at least one event: it waits for it
    arrived.put_nowait("late")
    assert await asyncio.wait_for(waiting, 1) == ["late"]
    arrived.put_nowait("unhandled")
    arrived.put_nowait(None)  # reading ended: what is left stays unacked
    assert await next_batch(arrived) is None


def test_a_worker_joining_a_balanced_group_gets_partitions(tmp_path: Path) -> None:
    """faust's assignor is sticky: a member keeps what it holds up to a capacity, which with
    standby replicas (faust's default: 1) is ceil(partitions / members). A 4th worker joining
    3 that held 2 of 6 partitions each got none, for as long as the group stayed so."""
    config = Settings(bootstrap_servers="127.0.0.1:1")
    app = build_app(config, EventRunner(config, PolicyRegistry(Policy()), Metrics()),
                    str(tmp_path))
    replicas = app.assignor.replicas

    @settings(max_examples=100, deadline=None)
    @given(st.data())
    def joining(data: st.DataObject) -> None:
        partitions = data.draw(st.integers(2, 24), label="partitions")
        members = data.draw(st.integers(1, partitions - 1), label="members")  # room for one more
        held = {f"w{m}": CopartitionedAssignment(actives=set(range(m, partitions, members)),
                                                 standbys=set(), topics={"in"})
                for m in range(members)}
        held["new"] = CopartitionedAssignment(actives=set(), standbys=set(), topics={"in"})
        assigned = CopartitionedAssignor(topics={"in"}, cluster_asgn=held,
                                         num_partitions=partitions,
                                         replicas=replicas).get_assignment()
        assert assigned["new"].actives, f"{members} members held {partitions} partitions"
        assert sorted(p for a in assigned.values() for p in a.actives) == list(range(partitions))

    joining()


async def test_the_table_manager_starts_recovery_without_faust_s_one_second_nap(
    tmp_path: Path,
) -> None:
    """faust's TableManager sleeps a second before starting recovery; a restarted replica's
    partitions waited that out. This app has no tables, so its manager goes straight on."""
    config = Settings(bootstrap_servers="127.0.0.1:1")
    app = build_app(config, EventRunner(config, PolicyRegistry(Policy()), Metrics()),
                    str(tmp_path))
    manager: Any = app.tables
    assert len(manager) == 0
    steps: list[str] = []

    async def step(name: str, *_: object) -> None:
        steps.append(name)

    manager.sleep = lambda seconds: step(f"sleep {seconds}")
    manager._update_channels = lambda: step("channels")
    manager._recovery = SimpleNamespace(start=lambda: step("recovery"))
    await manager.on_start()
    assert steps == ["channels", "recovery"]
