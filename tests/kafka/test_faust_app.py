"""faust's side of the worker, without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace

from tests.kafka.test_records import STAMPS
from worker.kafka.faust_app import COMMIT_GAP_SECONDS, _commit_delivered, seconds


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
