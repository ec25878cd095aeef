"""Run `context-assembler worker` as a real process, and read what it published."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord

from context_assembler import filemode
from context_assembler.intake.codec import Limits
from context_assembler.intake.policy_registry import build_registry
from harness.jvm import REPO
from harness.kafka import Broker

Header = tuple[str, bytes]
EXAMPLES = REPO / "examples"
# The policies the tests' workers allow a request to name (no shipped example names one;
# tests that do, name this preset: tests.factories.naming_policy).
ALLOWED_POLICIES = ["window-8k"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Topics:
    """Fresh topic names for one test, so tests never see each other's records."""

    input: str
    prompts: str
    audit: str
    dlq: str
    group: str
    policies: str  # compacted: the worker records its policies there before it consumes

    @classmethod
    def fresh(cls) -> Topics:
        tag = uuid.uuid4().hex[:8]
        return cls(f"{tag}.retrieval.results", f"{tag}.prompts.assembled", f"{tag}.context.audit",
                   f"{tag}.retrieval.results.dlq", f"{tag}-assembler", f"{tag}.assembler.policies")

    async def create(self, broker: Broker, partitions: int = 3) -> None:
        await broker.create_topics({self.input: partitions, self.prompts: partitions,
                                    self.audit: partitions, self.dlq: 1})
        await broker.create_topics({self.policies: 1}, compacted=True)


@dataclass
class WorkerProcess:
    broker: Broker
    topics: Topics
    log_path: Path
    guarantee: str = "at_least_once"
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    module: str = "context_assembler.cli"  # bench.passthrough: the same worker without the engine
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        env = {
            **os.environ,
            "ASSEMBLER_BOOTSTRAP_SERVERS": self.broker.bootstrap_servers,
            "ASSEMBLER_INPUT_TOPIC": self.topics.input,
            "ASSEMBLER_PROMPTS_TOPIC": self.topics.prompts,
            "ASSEMBLER_AUDIT_TOPIC": self.topics.audit,
            "ASSEMBLER_DLQ_TOPIC": self.topics.dlq,
            "ASSEMBLER_POLICIES_TOPIC": self.topics.policies,
            "ASSEMBLER_GROUP_ID": self.topics.group,
            "ASSEMBLER_PROCESSING_GUARANTEE": self.guarantee,
            "ASSEMBLER_HTTP_HOST": "127.0.0.1",
            "ASSEMBLER_HTTP_PORT": str(self.port),
            "ASSEMBLER_ALLOWED_POLICIES": ",".join(ALLOWED_POLICIES),
            **self.extra_env,
        }
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, "worker"], env=env, stdout=log, stderr=log,
            start_new_session=True,
        )
        return self

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.alive(), f"worker exited early; log:\n{self.log_tail()}"
            try:
                if self.get("/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready after {timeout}s; log:\n{self.log_tail()}")

    def metric(self, name: str) -> float:
        total = 0.0
        for line in self.get("/metrics")[1].decode().splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, timeout: float = 60) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class StartWorker(Protocol):
    """The integration tests' `running_worker` fixture: a started worker on `topics`,
    stopped after the test."""

    def __call__(self, topics: Topics, guarantee: str = "at_least_once", *,
                 log: str = "worker", env: dict[str, str] | None = None,
                 broker: Broker | None = None, ready: bool = True) -> WorkerProcess: ...


@contextmanager
def started_workers(default_broker: Callable[[], Broker], logs: Path) -> Iterator[StartWorker]:
    """Starts `context-assembler worker` on `topics` (log in logs/<log>.log), on
    `default_broker()` unless told another, and by default waits until it is ready. Every
    worker it started is stopped on leaving, whatever was done to it (stopped, killed, left
    running), so a failure leaves no process behind."""
    started: list[WorkerProcess] = []

    def start(topics: Topics, guarantee: str = "at_least_once", *, log: str = "worker",
              env: dict[str, str] | None = None, broker: Broker | None = None,
              ready: bool = True) -> WorkerProcess:
        worker = WorkerProcess(broker or default_broker(), topics, logs / f"{log}.log",
                               guarantee=guarantee, extra_env=env or {})
        started.append(worker.start())
        if ready:
            worker.wait_ready()
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


async def produce(broker: Broker, topic: str,
                  records: Iterable[tuple[bytes | None, bytes, list[Header]]]) -> None:
    producer = AIOKafkaProducer(acks="all", **broker.client_args())
    await producer.start()
    try:
        for key, value, headers in records:
            await producer.send(topic, value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


async def partitions_of(broker: Broker, topic: str, timeout: float = 60) -> list[int]:
    """The partitions of `topic`, once the broker's metadata has them. Every topic is asked
    for: asking for one by name could have the broker create it."""
    admin = AIOKafkaAdminClient(**broker.client_args())
    await admin.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            for entry in await admin.describe_topics():
                if entry["topic"] == topic and entry["error_code"] == 0 and entry["partitions"]:
                    return sorted(part["partition"] for part in entry["partitions"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"no metadata for topic {topic!r}")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def read_topic(broker: Broker, topic: str, *, until: int, timeout: float = 120,
                     committed_only: bool = False, settle: float = 0.0) -> list[ConsumerRecord]:
    """Every record from the beginning, until `until` records arrived (then `settle` s more)."""
    consumer = AIOKafkaConsumer(
        **broker.client_args(),
        isolation_level="read_committed" if committed_only else "read_uncommitted",
        enable_auto_commit=False,
    )
    partitions = await partitions_of(broker, topic)
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        assigned = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        settle_until: float | None = None
        while loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for messages in batch.values():
                records.extend(messages)
            if len(records) >= until and settle_until is None:
                settle_until = loop.time() + settle
            if settle_until is not None and loop.time() >= settle_until:
                break
    finally:
        await consumer.stop()
    return records


async def committed_offsets(broker: Broker, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset of each partition of `topic` (absent: none committed)."""
    admin = AIOKafkaAdminClient(**broker.client_args())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items()
            if tp.topic == topic and meta.offset >= 0}


async def end_offsets(broker: Broker, topic: str) -> dict[int, int]:
    """The offset after the last record of each partition of `topic`."""
    partitions = [TopicPartition(topic, p) for p in await partitions_of(broker, topic)]
    consumer = AIOKafkaConsumer(**broker.client_args())
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


def events(count: int) -> list[bytes]:
    """`count` distinct requests cycling through the shipped examples."""
    examples = (EXAMPLES / "events.jsonl").read_bytes().splitlines()
    out = []
    for n in range(count):
        event = json.loads(examples[n % len(examples)])
        event["request_id"] = f"{event['request_id']}-{n:04d}"
        out.append(orjson.dumps(event))
    return out


def file_mode(lines: list[bytes]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    prompts, audits = io.BytesIO(), io.BytesIO()
    filemode.run([("events", io.BytesIO(b"\n".join(lines)))],
                 build_registry(None, ALLOWED_POLICIES), Limits(),
                 prompts=prompts, audits=audits, errors=io.BytesIO())

    def by_id(data: bytes) -> dict[str, bytes]:
        return {json.loads(line)["request_id"]: line for line in data.splitlines()}
    return by_id(prompts.getvalue()), by_id(audits.getvalue())


def keyed(lines: list[bytes], headers: list[tuple[str, bytes]] | None = None
          ) -> list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]:
    return [(json.loads(line)["request_id"].encode(), line, headers or []) for line in lines]


async def wait_for(predicate: Callable[[], bool], timeout: float = 60) -> None:
    """Poll until `predicate()` holds (a metric, a count); fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("condition not met")
