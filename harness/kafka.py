"""Real Apache Kafka brokers on loopback from Maven Central jars: one node, or a replicated
cluster whose nodes a test can kill, pause, resume and restart.

Each node is broker and controller in one JVM (KRaft) with its config, data, log and pid in a
directory: DIR for a single broker, DIR/node1..N for a cluster. Tests and benchmarks use the
`Broker` classes; the Makefile and the docs use the same code through `python -m harness`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from harness.jvm import (
    FAST_TOOL,
    LOG4J,
    HarnessError,
    Jvm,
    cluster_id,
    fetch_kafka,
    free_ports,
    info,
    require,
)

T = TypeVar("T")
READY_TIMEOUT = float(os.environ.get("KAFKA_READY_TIMEOUT", "90"))
CLUSTER_READY_TIMEOUT = float(os.environ.get("KAFKA_READY_TIMEOUT", "120"))
SINGLE_NODE = """\
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
# A restarted broker's registration waits for its old session to expire (KAFKA-19130): a
# shorter session keeps a restart quick.
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
"""


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end from synchronous code, even when called from inside a
    running event loop (an async test restarting its broker): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def cluster_properties(replicas: int) -> str:
    """A node of a replicated cluster: a stopped or dead broker fenced after 3 s, a stopped
    follower out of the ISR after 6 s, fewer threads (several JVMs on two cores)."""
    isr = 2 if replicas > 1 else 1
    return f"""\
default.replication.factor={replicas}
min.insync.replicas={isr}
unclean.leader.election.enable=false
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=3
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={isr}
transaction.state.log.num.partitions=3
group.initial.rebalance.delay.ms=0
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
replica.lag.time.max.ms=6000
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
background.threads=2
log.cleaner.threads=1
"""


class Node:
    """One KRaft node (broker and controller) in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.jvm = Jvm(directory, "broker", "kafka.Kafka")
        self.properties = directory / "server.properties"

    @property
    def bootstrap(self) -> str:
        return (self.directory / "bootstrap").read_text().strip()

    def configure(self, node_id: int, port: int, controller_port: int, voters: str,
                  extra: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.directory / "data", ignore_errors=True)
        self.jvm.log.unlink(missing_ok=True)
        self.properties.write_text(f"""\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs={self.directory}/data
auto.create.topics.enable=false
{extra}""")
        (self.directory / "log4j2.properties").write_text(LOG4J)
        (self.directory / "bootstrap").write_text(f"127.0.0.1:{port}\n")

    def format(self, cluster: str, *extra: str) -> None:
        """Format the node's storage for `cluster` (`extra`: SCRAM users, say)."""
        jars = fetch_kafka()
        with self.jvm.log.open("ab") as log:
            formatted = subprocess.run(
                ["java", *FAST_TOOL, "-cp", f"{jars}/*", "kafka.tools.StorageTool", "format",
                 "-t", cluster, "-c", str(self.properties), *extra],
                stdout=log, stderr=log, check=False)
        if formatted.returncode != 0:
            raise HarnessError(f"formatting {self.directory}/data failed:\n"
                               + self.jvm.first_errors(20))

    def launch(self, heap: tuple[str, str] = ("256m", "512m"), *tuning: str) -> None:
        """Run the JVM detached; Log4j's own shutdown hook would cut the shutdown log short."""
        require("java", why="Kafka needs Java 17+")
        jars = fetch_kafka()
        self.jvm.launch([
            "java", f"-Xms{heap[0]}", f"-Xmx{heap[1]}", *tuning, "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.directory}/log4j2.properties",
            "-Dlog4j2.shutdownHookEnabled=false",
            "-cp", f"{jars}/*", "kafka.Kafka", str(self.properties)])


async def wait_ready(client_args: dict[str, Any], jvms: list[Jvm], brokers: int,
                     timeout: float) -> None:
    """Poll with real metadata requests until `brokers` brokers are registered and a
    controller elected, or a JVM exits, or time runs out."""
    from aiokafka.admin import AIOKafkaAdminClient

    logging.getLogger("aiokafka").disabled = True  # refused connections while JVMs start
    deadline = time.monotonic() + timeout
    found = "none"
    try:
        while True:
            for jvm in jvms:
                if not jvm.running():
                    raise HarnessError(f"the broker of {jvm.directory} exited "
                                       f"({jvm.exit_status()})")
            admin = AIOKafkaAdminClient(request_timeout_ms=5000, **client_args)
            try:
                await admin.start()
                cluster = await admin.describe_cluster()
                found = str(len(cluster["brokers"]))
                if len(cluster["brokers"]) >= brokers and cluster["controller_id"] >= 0:
                    return
            except Exception as exc:  # any failure is "not yet" until the deadline
                found = repr(exc)
            finally:
                await admin.close()
            if time.monotonic() > deadline:
                raise HarnessError(f"{brokers} broker(s) not ready within {timeout:.0f} s "
                                   f"(found: {found})")
            await asyncio.sleep(0.25)
    finally:
        logging.getLogger("aiokafka").disabled = False


class Broker(ABC):
    """What a test needs from a broker, whoever runs it."""

    @property
    @abstractmethod
    def bootstrap_servers(self) -> str:
        """host:port[,host:port...] for Kafka clients."""

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
                            configs: dict[str, str] | None = None,
                            replication_factor: int = 1) -> None:
        """Create topics (name -> partitions) and wait until every partition has a leader.

        The broker does not auto-create topics, and a client's first request may otherwise
        race the new partitions' leader election. Existing topics are left as they are.
        `configs` are topic configs, such as a max.message.bytes below the worker's.
        """
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        configs = {**({"cleanup.policy": "compact"} if compacted else {}), **(configs or {})}
        topics = [NewTopic(name, partitions, replication_factor, topic_configs=configs)
                  for name, partitions in names.items()]
        admin = AIOKafkaAdminClient(**self.client_args())
        await admin.start()
        try:
            response = await admin.create_topics(topics)
            failures = [
                f"{error['topic']}: {error['error_message']}"
                for error in response.to_object()["topic_errors"]
                if error["error_code"] not in (0, TopicAlreadyExistsError.errno)
            ]
            if failures:
                raise RuntimeError("could not create topics: " + "; ".join(failures))
            async with asyncio.timeout(30):
                while not await _all_partitions_led(admin, list(names)):
                    await asyncio.sleep(0.1)
        finally:
            await admin.close()


async def _all_partitions_led(admin: Any, names: list[str]) -> bool:
    """True when the metadata lists every topic with a leader for each partition."""
    described = await admin.describe_topics(names)
    return len(described) == len(names) and all(
        topic["error_code"] == 0
        and topic["partitions"]
        and all(partition["leader"] >= 0 for partition in topic["partitions"])
        for topic in described
    )


class LocalBroker(Broker):
    """A single-node broker with its config, data and log in `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.absolute()
        self.node = Node(self.workdir)

    @property
    def bootstrap_servers(self) -> str:
        if not (self.workdir / "bootstrap").is_file():
            raise HarnessError(f"no broker was started in {self.workdir}")
        return self.node.bootstrap

    def running(self) -> bool:
        return self.node.jvm.running()

    def start(self) -> None:
        """A fresh broker on free loopback ports (about 5 s; the first run downloads jars)."""
        if self.running():
            raise HarnessError(f"a broker is already running from {self.workdir} "
                               "(use restart or stop)")
        require("java", why="Kafka needs Java 17+")
        fetch_kafka()
        port, controller_port = free_ports(2)
        self.node.configure(1, port, controller_port, f"1@127.0.0.1:{controller_port}",
                            SINGLE_NODE)
        self.node.format(cluster_id())
        self._launch()

    def restart(self) -> None:
        """Stop and start again on the same port and data, as a crashed-and-recovered broker."""
        if not (self.node.properties.is_file() and (self.workdir / "data").is_dir()):
            raise HarnessError(f"no broker was started in {self.workdir}")
        self.stop()
        self._launch()

    def _launch(self) -> None:
        self.node.launch()
        try:
            run_sync(wait_ready(self.client_args(), [self.node.jvm], 1, READY_TIMEOUT))
        except HarnessError as error:
            log = self.node.jvm.first_errors()
            self.stop()
            raise HarnessError(f"{log}\nbroker in {self.workdir} did not become ready: "
                               f"{error}") from None
        info(f"broker ready on {self.bootstrap_servers} (pid {self.node.jvm.pid})")

    def stop(self) -> None:
        self.node.jvm.stop()


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
        import pytest

        pytest.skip("cannot restart the external broker named by KAFKA_BOOTSTRAP_SERVERS")


def broker_from_env(workdir: Path) -> Broker:
    """The external broker if KAFKA_BOOTSTRAP_SERVERS is set, else one run from workdir."""
    bootstrap_servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if bootstrap_servers:
        return ExternalBroker(bootstrap_servers)
    return LocalBroker(workdir)


@contextmanager
def running_broker(workdir: Path) -> Iterator[Broker]:
    """`broker_from_env(workdir)`, started for the block and stopped after it."""
    broker = broker_from_env(workdir)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


class Cluster:
    """`nodes` KRaft nodes in `workdir`/nodeK: replication factor 3 (or `nodes` if fewer),
    min.insync.replicas=2, unclean leader election off; 384 MB heaps (KAFKA_HEAP)."""

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        self.workdir = workdir.absolute()
        self.nodes = nodes
        self.heap = os.environ.get("KAFKA_HEAP", "384m")

    def node(self, node_id: int) -> Node:
        node = Node(self.workdir / f"node{node_id}")
        if not node.properties.is_file():
            raise HarnessError(f"no node {node_id} in {self.workdir}")
        return node

    def node_ids(self) -> list[int]:
        found = [int(path.parent.name[4:]) for path in self.workdir.glob("node*/server.properties")
                 if path.parent.name[4:].isdigit()]
        return sorted(found)

    @property
    def bootstrap_servers(self) -> str:
        servers = [self.node(node_id).bootstrap for node_id in self.node_ids()]
        if not servers:
            raise HarnessError(f"no cluster was started in {self.workdir}")
        return ",".join(servers)

    def start(self) -> None:
        if self.nodes < 1:
            raise HarnessError(f"bad node count: {self.nodes}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for node_id in self.node_ids():
            if self.node(node_id).jvm.running():
                raise HarnessError(f"node {node_id} of {self.workdir} is running (use stop first)")
        require("java", why="Kafka needs Java 17+")
        fetch_kafka()
        ports = free_ports(2 * self.nodes)
        ids = range(1, self.nodes + 1)
        voters = ",".join(f"{i}@127.0.0.1:{ports[2 * i - 1]}" for i in ids)
        for old in self.workdir.glob("node*"):
            shutil.rmtree(old)
        cluster = cluster_id()
        replicas = min(self.nodes, 3)
        for i in ids:
            node = Node(self.workdir / f"node{i}")
            node.configure(i, ports[2 * i - 2], ports[2 * i - 1], voters,
                           cluster_properties(replicas))
            node.format(cluster)
        for i in ids:
            self._launch(self.node(i))
        self._wait_ready("the cluster did not become ready", stop_on_failure=True)
        pids = " ".join(str(self.node(i).jvm.pid) for i in ids)
        info(f"{self.nodes} nodes ready (pids {pids})")

    def _launch(self, node: Node) -> None:
        node.launch((self.heap, self.heap), "-XX:+UseSerialGC", "-XX:CICompilerCount=2")

    def _wait_ready(self, failure: str, *, stop_on_failure: bool = False) -> None:
        nodes = [self.node(i) for i in self.node_ids()]
        jvms = [node.jvm for node in nodes if node.jvm.running()]
        try:
            run_sync(wait_ready({"bootstrap_servers": self.bootstrap_servers}, jvms, len(nodes),
                                CLUSTER_READY_TIMEOUT))
        except HarnessError as error:
            logs = "\n".join(node.jvm.first_errors(0) for node in nodes)
            if stop_on_failure:
                self.stop()
            raise HarnessError(f"{logs}\n{failure} in {self.workdir}: {error}") from None

    def stop(self) -> None:
        """SIGTERM every node at once (a node waits for its quorum peers in parallel)."""
        if not self.workdir.is_dir():
            return
        nodes = [self.node(i) for i in self.node_ids()]
        for node in nodes:
            if node.jvm.running():
                node.jvm.signal(signal.SIGCONT)
                node.jvm.signal(signal.SIGTERM)
        for node in nodes:
            node.jvm.wait_stopped()

    def pid(self, node_id: int) -> int:
        return self.node(node_id).jvm.pid

    def _signal(self, node_id: int, signum: signal.Signals) -> None:
        node = self.node(node_id)
        if not node.jvm.running():
            raise HarnessError(f"node {node_id} of {self.workdir} is not running")
        node.jvm.signal(signum)

    def kill(self, node_id: int) -> None:
        """kill -9: a crashed host."""
        self._signal(node_id, signal.SIGKILL)

    def pause(self, node_id: int) -> None:
        """SIGSTOP: a long GC pause, a partitioned host."""
        self._signal(node_id, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        self._signal(node_id, signal.SIGCONT)

    def restart(self, node_id: int) -> None:
        """Start a killed node again on its ports and data; returns once all nodes are back."""
        node = self.node(node_id)
        if node.jvm.running():
            raise HarnessError(f"node {node_id} of {self.workdir} is running")
        self._launch(node)
        self._wait_ready(f"node {node_id} did not rejoin")
        info(f"node {node_id} back (pid {node.jvm.pid})")

    async def busiest_leader(self, topics: list[str]) -> int:
        """The node leading the most partitions of `topics`."""
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                    request_timeout_ms=10_000)
        await admin.start()
        try:
            described = await admin.describe_topics(topics)
        finally:
            await admin.close()
        leaders = Counter(p["leader"] for t in described for p in t["partitions"]
                          if p["leader"] >= 0)
        return leaders.most_common(1)[0][0] if leaders else 1
