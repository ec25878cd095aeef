"""scripts/kafka-cluster.sh from Python: the nodes, their pids, and who leads what."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kafka-cluster.sh"


class Cluster:
    """A cluster of `nodes` KRaft nodes (broker + controller each) with its files in `workdir`."""

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        self.workdir = workdir
        self.nodes = nodes
        self.bootstrap_servers = ""

    def _script(self, *args: str) -> str:
        env = {"PYTHON": sys.executable, **os.environ}
        result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                                env=env, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"kafka-cluster.sh {' '.join(args)} failed:\n{result.stderr}")
        lines = result.stdout.strip().splitlines()
        return lines[-1] if lines else ""

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bootstrap_servers = self._script("start", str(self.workdir), str(self.nodes))

    def stop(self) -> None:
        self._script("stop", str(self.workdir))

    def pid(self, node: int) -> int:
        return int((self.workdir / f"node{node}" / "broker.pid").read_text())

    def kill(self, node: int) -> None:
        os.kill(self.pid(node), signal.SIGKILL)

    def pause(self, node: int) -> None:
        os.kill(self.pid(node), signal.SIGSTOP)

    def resume(self, node: int) -> None:
        os.kill(self.pid(node), signal.SIGCONT)

    def restart(self, node: int) -> None:
        """Start a killed node again on its ports and data; returns once all nodes are back."""
        self._script("restart", str(self.workdir), str(node))

    async def busiest_leader(self, topics: list[str]) -> int:
        """The node leading the most partitions of `topics`."""
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
