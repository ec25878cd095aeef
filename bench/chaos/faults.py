"""The faults, their seeded schedule, and how each is done and undone."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.kafka import Cluster
from harness.worker import WorkerProcess

KILL_WORKER = "kill_worker"  # kill -9, then started again with the same group.instance.id
PAUSE_WORKER = "pause_worker"  # SIGSTOP past the session timeout, then SIGCONT: a zombie
KILL_LEADER = "kill_leader_broker"  # kill -9 the node leading most input partitions, restart
PAUSE_BROKER = "pause_broker"  # SIGSTOP a node for a while, then SIGCONT
ADD_REMOVE_WORKER = "add_remove_worker"  # a fourth worker joins under load, then SIGTERM
KINDS = (KILL_WORKER, PAUSE_WORKER, KILL_LEADER, PAUSE_BROKER, ADD_REMOVE_WORKER)

BROKER_DOWN_SECONDS = 4.0
BROKER_PAUSE_SECONDS = 8.0
EXTRA_WORKER_SECONDS = 8.0  # an added worker runs this long once ready, then leaves


def schedule(kinds: list[str], count: int, seed: int) -> list[str]:
    """`count` faults, each kind of `kinds` as often as the others (±1), in a seeded order."""
    rng = random.Random(seed)
    drawn = (kinds * (count // len(kinds) + 1))[:count]
    rng.shuffle(drawn)
    return drawn


@dataclass
class Fault:
    kind: str
    target: str = ""
    at_s: float = 0.0  # seconds since the run's start
    end_s: float = 0.0  # when the fault was undone and the target back
    error: str = ""  # the target did not come back (a worker never ready again): why


@dataclass
class Workers:
    """The worker processes by slot; a slot keeps its group.instance.id across restarts, as
    a StatefulSet pod keeps its name."""

    spawn: Callable[[int], WorkerProcess]
    slots: dict[int, WorkerProcess] = field(default_factory=dict)

    def start(self, slot: int) -> WorkerProcess:
        self.slots[slot] = self.spawn(slot).start()
        return self.slots[slot]

    async def ready(self, slot: int, timeout: float = 90) -> None:
        await asyncio.to_thread(self.slots[slot].wait_ready, timeout)

    def stop_all(self) -> None:
        for proc in self.slots.values():
            if proc.process is not None and proc.process.poll() is None:
                os.kill(proc.process.pid, signal.SIGCONT)
                proc.stop()


async def inject(kind: str, workers: Workers, cluster: Cluster, input_topic: str,
                 rng: random.Random, session_timeout: float, began: float) -> list[Fault]:
    """Do the fault and undo it. Returns what was done, timed from `began`: one Fault, or for
    ADD_REMOVE_WORKER two (add_worker until the new worker is ready, remove_worker from its
    SIGTERM until it exited), whose latencies differ."""

    def now() -> float:
        return time.monotonic() - began

    base = sorted(s for s in workers.slots if s < 3)
    fault = Fault(kind, at_s=now())
    if kind == KILL_WORKER:
        slot = rng.choice(base)
        fault.target = f"worker {slot}"
        workers.slots[slot].kill()
        workers.start(slot)
        await workers.ready(slot)
    elif kind == PAUSE_WORKER:
        slot = rng.choice(base)
        fault.target = f"worker {slot}"
        pid = workers.slots[slot].process.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(session_timeout + 4)
        os.kill(pid, signal.SIGCONT)
        await workers.ready(slot)
    elif kind == KILL_LEADER:
        node = await cluster.busiest_leader([input_topic])
        fault.target = f"broker {node}"
        cluster.kill(node)
        await asyncio.sleep(BROKER_DOWN_SECONDS)
        await asyncio.to_thread(cluster.restart, node)
    elif kind == PAUSE_BROKER:
        node = rng.randint(1, cluster.nodes)
        fault.target = f"broker {node}"
        cluster.pause(node)
        await asyncio.sleep(BROKER_PAUSE_SECONDS)
        cluster.resume(node)
    elif kind == ADD_REMOVE_WORKER:
        added = Fault("add_worker", "worker 3", fault.at_s)
        workers.start(3)
        try:
            await workers.ready(3)
        except BaseException:
            await asyncio.to_thread(workers.slots.pop(3).stop)
            raise
        added.end_s = now()
        await asyncio.sleep(EXTRA_WORKER_SECONDS)
        removed = Fault("remove_worker", "worker 3", now())
        await asyncio.to_thread(workers.slots.pop(3).stop)
        removed.end_s = now()
        return [added, removed]
    else:
        raise ValueError(f"unknown fault {kind}")
    fault.end_s = now()
    return [fault]
