"""scripts/kafka-cluster.sh's bookkeeping, without starting a JVM (`make chaos` starts a
real cluster with it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kafka-cluster.sh"


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          check=False, timeout=60)


def fake_cluster(root: Path, ports: dict[int, int]) -> None:
    """The files `start` leaves per node, for nodes that are not running."""
    for node, port in ports.items():
        node_dir = root / f"node{node}"
        node_dir.mkdir(parents=True)
        (node_dir / "server.properties").write_text(f"node.id={node}\n")
        (node_dir / "bootstrap").write_text(f"127.0.0.1:{port}\n")
        (node_dir / "broker.pid").write_text("999999\n")  # no such process


def test_bootstrap_lists_every_node_in_node_order(tmp_path: Path) -> None:
    fake_cluster(tmp_path, {10: 9010, 2: 9002, 1: 9001})
    result = script("bootstrap", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "127.0.0.1:9001,127.0.0.1:9002,127.0.0.1:9010"
    assert script("pid", str(tmp_path), "2").stdout.strip() == "999999"


def test_stop_with_no_node_running_only_forgets_the_pids(tmp_path: Path) -> None:
    fake_cluster(tmp_path, {1: 9001, 2: 9002})
    assert script("stop", str(tmp_path)).returncode == 0
    assert not list(tmp_path.glob("node*/broker.pid"))


def test_node_commands_refuse_a_node_that_is_not_there_or_not_running(tmp_path: Path) -> None:
    fake_cluster(tmp_path, {1: 9001})
    missing = script("kill", str(tmp_path), "4")
    assert missing.returncode == 1 and "no node 4" in missing.stderr
    stopped = script("pause", str(tmp_path), "1")
    assert stopped.returncode == 1 and "not running" in stopped.stderr
    assert script("bootstrap", str(tmp_path / "nowhere")).returncode == 1
    usage = script("frobnicate")
    assert usage.returncode == 1 and "usage" in usage.stderr
