"""A real Kafka broker for integration tests.

Tests talk to a genuine Apache Kafka 4.0 broker rather than a fake, so protocol and
group-coordination behaviour are the real thing. By default scripts/kafka.sh runs one from
Maven Central jars; set KAFKA_BOOTSTRAP_SERVERS to use a broker that is already running.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

KAFKA_SH = Path(__file__).resolve().parents[2] / "scripts" / "kafka.sh"
TOPIC_ALREADY_EXISTS = 36


class Broker(ABC):
    """What a test needs from a broker, whoever runs it."""

    @property
    @abstractmethod
    def bootstrap_servers(self) -> str:
        """host:port for Kafka clients."""

    def client_args(self) -> dict[str, Any]:
        """aiokafka arguments for the tests' own clients (a secured broker's admin's)."""
        return {"bootstrap_servers": self.bootstrap_servers}

    @abstractmethod
    def start(self) -> None:
        """Make the broker available; returns once it answers metadata requests."""

    @abstractmethod
    def stop(self) -> None:
        """Release the broker; safe to call more than once."""

    @abstractmethod
    def restart(self) -> None:
        """Bounce the broker with its data kept, to test recovery from a lost connection."""

    async def create_topics(self, names: dict[str, int], *, compacted: bool = False,
                            configs: dict[str, str] | None = None) -> None:
        """Create topics (name -> partitions) and wait until every partition has a leader.

        The broker does not auto-create topics, and a client's first request may otherwise
        race the new partitions' leader election. Existing topics are left as they are.
        `configs` are topic configs, such as a max.message.bytes below the worker's.
        """
        configs = {**({"cleanup.policy": "compact"} if compacted else {}), **(configs or {})}
        topics = [
            NewTopic(name, partitions, 1, topic_configs=configs)
            for name, partitions in names.items()
        ]
        admin = AIOKafkaAdminClient(**self.client_args())
        await admin.start()
        try:
            response = await admin.create_topics(topics)
            failures = [
                f"{error['topic']}: {error['error_message']}"
                for error in response.to_object()["topic_errors"]
                if error["error_code"] not in (0, TOPIC_ALREADY_EXISTS)
            ]
            if failures:
                raise RuntimeError("could not create topics: " + "; ".join(failures))
            async with asyncio.timeout(30):
                while not await _all_partitions_led(admin, list(names)):
                    await asyncio.sleep(0.1)
        finally:
            await admin.close()


async def _all_partitions_led(admin: AIOKafkaAdminClient, names: list[str]) -> bool:
    """True when the metadata lists every topic with a leader for each partition."""
    described = await admin.describe_topics(names)
    return len(described) == len(names) and all(
        topic["error_code"] == 0
        and topic["partitions"]
        and all(partition["leader"] >= 0 for partition in topic["partitions"])
        for topic in described
    )


class KafkaBroker(Broker):
    """A single-node broker run by scripts/kafka.sh, with its config, data and log in workdir."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._bootstrap_servers: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap_servers is None:
            raise RuntimeError("the broker has not been started")
        return self._bootstrap_servers

    def start(self) -> None:
        """Start a fresh broker on free loopback ports (about 5 s; the first run downloads jars)."""
        self._bootstrap_servers = self._kafka_sh("start")

    def stop(self) -> None:
        self._kafka_sh("stop")

    def restart(self) -> None:
        """Stop and start again on the same port and data, as a crashed-and-recovered broker."""
        self._kafka_sh("restart")

    def _kafka_sh(self, command: str) -> str:
        """Run scripts/kafka.sh; returns the last line it prints (the bootstrap address)."""
        # The readiness check imports aiokafka: use this interpreter, whose venv has it.
        env = {"PYTHON": sys.executable, **os.environ}
        result = subprocess.run(
            ["bash", str(KAFKA_SH), command, str(self.workdir)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"scripts/kafka.sh {command} {self.workdir} failed "
                f"(exit {result.returncode}):\n{result.stderr}"
            )
        lines = result.stdout.strip().splitlines()
        return lines[-1] if lines else ""


class ExternalBroker(Broker):
    """A broker somebody else runs (KAFKA_BOOTSTRAP_SERVERS); tests never start or stop it."""

    def __init__(self, bootstrap_servers: str) -> None:
        self._bootstrap_servers = bootstrap_servers

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap_servers

    def start(self) -> None:
        """Nothing to do: the broker is already running."""

    def stop(self) -> None:
        """Nothing to do: the broker belongs to someone else."""

    def restart(self) -> None:
        """Skips the calling test: a broker we do not own cannot be bounced."""
        pytest.skip("cannot restart the external broker named by KAFKA_BOOTSTRAP_SERVERS")


def broker_from_env(workdir: Path) -> Broker:
    """The external broker if KAFKA_BOOTSTRAP_SERVERS is set, else one run from workdir."""
    bootstrap_servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if bootstrap_servers:
        return ExternalBroker(bootstrap_servers)
    return KafkaBroker(workdir)


@contextmanager
def running_broker(workdir: Path) -> Iterator[Broker]:
    """`broker_from_env(workdir)`, started for the block and stopped after it."""
    broker = broker_from_env(workdir)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
