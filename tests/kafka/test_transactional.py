"""The exactly_once path's rebalance listener (the transactions themselves are tested on a
real broker in tests/integration)."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from worker.kafka.transactional import _Assignment

TP0, TP1 = TopicPartition("in", 0), TopicPartition("in", 1)


async def test_a_revocation_waits_for_the_open_transaction_to_end() -> None:
    assignment = _Assignment(wait_seconds=5)
    await assignment.on_partitions_assigned([TP0, TP1])
    ended: list[str] = []
    release = asyncio.Event()

    async def transaction() -> None:
        await release.wait()
        ended.append("committed")

    assignment.open = asyncio.create_task(transaction())
    revoking = asyncio.create_task(assignment.on_partitions_revoked([TP0]))
    await asyncio.sleep(0.05)
    assert not revoking.done(), "gave the partition away while its transaction was open"
    release.set()
    await revoking
    assert ended == ["committed"]
    assert assignment.partitions == {TP1}


async def test_a_revocation_gives_up_waiting_after_its_bound() -> None:
    assignment = _Assignment(wait_seconds=0.05)
    await assignment.on_partitions_assigned([TP0])
    async def never_ends() -> None:
        await asyncio.Event().wait()

    stuck = asyncio.create_task(never_ends())
    assignment.open = stuck
    await assignment.on_partitions_revoked([TP0])
    assert assignment.partitions == set()
    stuck.cancel()


async def test_without_an_open_transaction_a_revocation_is_immediate() -> None:
    assignment = _Assignment(wait_seconds=60)
    await assignment.on_partitions_assigned([TP0, TP1])
    await asyncio.wait_for(assignment.on_partitions_revoked([TP0, TP1]), timeout=1)
    assert assignment.partitions == set()
