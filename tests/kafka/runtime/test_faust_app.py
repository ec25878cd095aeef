"""faust's side of the worker, without a broker."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import faust
import pytest
from faust.assignor.client_assignment import CopartitionedAssignment
from faust.assignor.copartitioned_assignor import CopartitionedAssignor
from faust.tables import TableManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.runtime import faust_app
from context_assembler.kafka.runtime.faust_app import (
    FaustWorker,
    _App,
    _Consumer,
    _ConsumerThread,
    _FaustRuntime,
    _Tableless,
    _Transport,
    build_app,
    seconds,
)
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.tuning import ENGINE_BATCH
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings
from tests.kafka.conftest import make_runner
from tests.kafka.test_records import STAMPS


def faust_send_ms(timestamp: float | None) -> float | None:
    """What faust's Producer.send makes of the timestamp it is given (its own expression)."""
    return int(timestamp * 1000.0) if timestamp else timestamp


def app_on(datadir: Path) -> _App:
    """The at_least_once app, as the worker builds it, for a broker never reached."""
    config = Settings(bootstrap_servers="127.0.0.1:1")
    return build_app(config, EventRunner(config, PolicyRegistry(Policy()), Metrics()),
                     str(datadir))


def test_outputs_get_the_inputs_timestamp_to_the_millisecond() -> None:
    for ms in STAMPS:
        sent = faust_send_ms(seconds(ms))
        assert sent == ms and isinstance(sent, int)  # 0 too: faust would pass 0.0 on as is
    assert faust_send_ms(seconds(None)) is None  # the producer stamps it


class GatedConsumer:
    """faust's consumer, with commits that end when the test says so."""

    def __init__(self) -> None:
        self.started = 0
        self.gate = asyncio.Event()

    async def maybe_wait_for_commit_to_finish(self) -> bool:
        return False

    async def commit(self) -> bool:
        self.started += 1
        await self.gate.wait()
        self.gate.clear()
        return True


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(1):
        while not condition():
            await asyncio.sleep(0.005)


def runtime_over(consumer: GatedConsumer) -> _FaustRuntime:
    app: Any = SimpleNamespace(consumer=consumer)
    return _FaustRuntime(app, Settings(bootstrap_servers="127.0.0.1:1"), make_runner())


async def test_a_commit_in_progress_survives_the_delivery_being_cancelled() -> None:
    consumer = GatedConsumer()
    commit = asyncio.create_task(runtime_over(consumer).commit())
    await until(lambda: consumer.started == 1)
    inner = next(t for t in asyncio.all_tasks() if t is not commit
                 and t is not asyncio.current_task())
    commit.cancel()
    await asyncio.sleep(0.01)
    assert commit.cancelled() and not inner.done()  # faust's books stay whole
    consumer.gate.set()
    await asyncio.wait_for(inner, 1)


async def test_a_commit_waits_for_the_one_in_progress_then_commits_the_rest() -> None:
    consumer = GatedConsumer()
    runtime = runtime_over(consumer)
    first = asyncio.create_task(runtime.commit())
    await until(lambda: consumer.started == 1)
    second = asyncio.create_task(runtime.commit())  # acks since the first began
    await asyncio.sleep(0.01)
    assert consumer.started == 1
    consumer.gate.set()
    await until(lambda: consumer.started == 2)  # not only waited for the first: committed
    consumer.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 1)


# What the adapter overrides or calls of faust-streaming (and mode-streaming, its service
# library) beyond its documented API, as pinned in constraints.txt: each must still be
# there, or an upgrade changed what the adapter relies on.
FAUST_INTERNALS = [
    (faust_aiokafka.Consumer, "on_partitions_revoked"),
    (faust_aiokafka.Consumer, "_new_consumer_thread"),
    (faust_aiokafka.Consumer, "maybe_wait_for_commit_to_finish"),
    (faust_aiokafka.Consumer, "wait_first"),
    (faust_aiokafka.Consumer, "on_buffer_full"),
    (faust_aiokafka.Consumer, "_to_message"),
    (faust_aiokafka.Consumer, "_set_active_tps"),
    (faust_aiokafka.Consumer, "_get_active_partitions"),
    (faust_aiokafka.AIOKafkaConsumerThread, "on_thread_stop"),
    (faust_aiokafka.AIOKafkaConsumerThread, "_fetch_records"),
    (faust_aiokafka.Transport, "Consumer"),
    (TableManager, "on_start"),
    (TableManager, "_update_channels"),
    (TableManager, "recovery"),
    (faust.App, "_new_transport"),
    (faust.Worker, "install_signal_handlers"),
    (faust.Worker, "_on_sigterm"),
    (faust.Worker, "_on_sigint"),
    (faust.Settings, "stream_wait_empty"),
    (faust.Stream, "noack"),
]


def test_constraints_pin_the_faust_version_the_adapter_names() -> None:
    pinned = (Path(__file__).parents[3] / "constraints.txt").read_text().splitlines()
    assert f"faust-streaming=={faust.__version__}" in pinned
    assert f"faust-streaming {faust.__version__}" in inspect.getsource(faust_app)


@pytest.mark.parametrize(("owner", "name"), FAUST_INTERNALS,
                         ids=[f"{owner.__name__}.{name}" for owner, name in FAUST_INTERNALS])
def test_what_the_adapter_relies_on_is_still_in_faust(owner: type, name: str) -> None:
    assert hasattr(owner, name), f"faust {faust.__version__} has no {owner.__name__}.{name}"


def test_every_faust_method_the_adapter_overrides_is_checked() -> None:
    checked = {(owner, name) for owner, name in FAUST_INTERNALS}
    for subclass in (_Consumer, _ConsumerThread, _Tableless, _Transport, _App, FaustWorker):
        faust_base = subclass.__mro__[1]
        for name, value in vars(subclass).items():
            if callable(value) and hasattr(faust_base, name) and not name.startswith("__"):
                assert any((owner, name) in checked for owner in faust_base.__mro__), (
                    f"{subclass.__name__}.{name} overrides faust: add it to FAUST_INTERNALS")


def test_faust_hands_each_message_over_in_the_form_the_consumer_races() -> None:
    """`_Consumer.wait_first` recognises the fetcher's hand-over by this call."""
    drain = inspect.getsource(faust_aiokafka.Consumer._drain_messages)
    assert "self.wait_first(\n" in drain and "callback(message), self.suspend_flow.wait()" in drain


@pytest.fixture
async def consumer(tmp_path: Path) -> _Consumer:
    """faust's consumer, made on the test's event loop as the worker makes it on its own."""
    app = app_on(tmp_path)
    return cast(_Consumer, app.consumer)


def other_tasks() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


async def test_a_hand_over_that_finds_room_ends_at_once_with_no_task(consumer: _Consumer) -> None:
    handed: list[str] = []

    async def hand_over(message: str) -> str:
        handed.append(message)
        return "put"

    before = other_tasks()
    suspended = consumer.suspend_flow.wait()
    done = await consumer.wait_first(hand_over("m1"), suspended)
    assert handed == ["m1"] and done.results == ["put"] and not done.stopped
    assert other_tasks() == before  # none started, none left behind
    assert inspect.getcoroutinestate(suspended) == inspect.CORO_CLOSED  # never "not awaited"


async def test_a_hand_over_that_waits_goes_on_when_room_is_made(consumer: _Consumer) -> None:
    room = asyncio.get_running_loop().create_future()
    steps: list[object] = []

    async def hand_over() -> str:
        steps.append("full")
        steps.append(await room)
        await asyncio.sleep(0)  # a bare yield, as asyncio.sleep(0) makes, passes through too
        return "put"

    waiting = asyncio.create_task(consumer.wait_first(hand_over(), consumer.suspend_flow.wait()))
    await asyncio.sleep(0.01)
    assert steps == ["full"] and not waiting.done()
    room.set_result("room")
    done = await asyncio.wait_for(waiting, 1)
    assert steps == ["full", "room"] and done.results == ["put"]


async def test_a_hand_over_that_waits_is_cancelled_when_the_flow_is_suspended(
    consumer: _Consumer,
) -> None:
    """As faust's own race: a rebalance does not wait behind a stream that is full."""
    seen: list[str] = []

    async def hand_over() -> None:
        try:
            await asyncio.get_running_loop().create_future()  # a full stream, for good
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    waiting = asyncio.create_task(consumer.wait_first(hand_over(), consumer.suspend_flow.wait()))
    await asyncio.sleep(0.01)
    consumer.suspend_flow.set()
    done = await asyncio.wait_for(waiting, 1)
    await asyncio.sleep(0.01)
    assert done.results == [True] and seen == ["cancelled"]


@pytest.mark.parametrize("waits_first", [False, True], ids=["at once", "after waiting"])
async def test_a_hand_over_that_fails_raises_its_error(consumer: _Consumer,
                                                       waits_first: bool) -> None:
    async def hand_over() -> None:
        if waits_first:
            await asyncio.sleep(0.001)
        raise KeyError("no callback for the partition")

    suspended = consumer.suspend_flow.wait()
    with pytest.raises(KeyError):
        await consumer.wait_first(hand_over(), suspended)
    await asyncio.sleep(0.01)  # faust's race cancels its task for the wait
    assert inspect.getcoroutinestate(suspended) == inspect.CORO_CLOSED


async def test_other_waits_are_faust_s_own(consumer: _Consumer) -> None:
    async def answer() -> int:
        return 42

    done = await consumer.wait_first(answer(), timeout=1)
    assert done.results == [42]


def test_the_stream_holds_eight_engine_batches_and_a_full_one_pauses_no_fetching(
    tmp_path: Path,
) -> None:
    """faust's default buffer (4,096 events) fetched a whole backlog ahead of the agent: up
    to 4 GB of 1 MiB events. The agent's stream holds eight engine batches, and a message
    handed over to a full stream waits for room. faust would also stop fetching every
    partition whose messages met a stream 4/5 full, then nap a second at a time with all of
    them stopped: the partitions stay fetched."""
    app = app_on(tmp_path)
    queue = next(iter(app.agents.values())).channel.queue
    assert queue.maxsize == 8 * ENGINE_BATCH
    consumer = cast(_Consumer, app.consumer)
    partitions = {TP("in", partition) for partition in range(3)}
    consumer._set_active_tps(partitions)
    pressed = 0
    while not queue.full():
        tp = TP("in", queue.qsize() % 3)
        # As faust's conductor hands a message over: the pressure goes to the consumer.
        pressed += queue.put_nowait_enhanced(
            object(), on_pressure_high=lambda tp=tp: consumer.on_buffer_full(tp),
            on_pressure_drop=lambda: None)
    assert pressed  # the pressure was reported
    assert consumer._get_active_partitions() == partitions


def test_a_worker_joining_a_balanced_group_gets_partitions(tmp_path: Path) -> None:
    """faust's assignor is sticky: a member keeps what it holds up to a capacity, which with
    standby replicas (faust's default: 1) is ceil(partitions / members). A 4th worker joining
    3 that held 2 of 6 partitions each got none, for as long as the group stayed so."""
    app = app_on(tmp_path)
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
    app = app_on(tmp_path)
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
