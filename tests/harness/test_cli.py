"""`python -m harness`'s bookkeeping, without starting a JVM (`make chaos` and the
integration tests start real ones with it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=60)


def fake_node(directory: Path, node: int, port: int) -> None:
    """The files `start` leaves for a node that is not running."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "server.properties").write_text(f"node.id={node}\n")
    (directory / "bootstrap").write_text(f"127.0.0.1:{port}\n")
    (directory / "broker.pid").write_text("999999\n")  # no such process


def test_cluster_address_lists_every_node_in_node_order(tmp_path: Path) -> None:
    for node, port in {10: 9010, 2: 9002, 1: 9001}.items():
        fake_node(tmp_path / f"node{node}", node, port)
    result = harness("cluster", "address", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "127.0.0.1:9001,127.0.0.1:9002,127.0.0.1:9010\n"
    assert harness("cluster", "pid", str(tmp_path), "2").stdout == "999999\n"


def test_stop_with_nothing_running_only_forgets_the_pids(tmp_path: Path) -> None:
    for node in (1, 2):
        fake_node(tmp_path / f"node{node}", node, 9000 + node)
    assert harness("cluster", "stop", str(tmp_path)).returncode == 0
    assert not list(tmp_path.glob("node*/broker.pid"))
    fake_node(tmp_path / "single", 1, 9092)
    assert harness("broker", "stop", str(tmp_path / "single")).returncode == 0
    assert not (tmp_path / "single" / "broker.pid").exists()
    assert harness("broker", "stop", str(tmp_path / "never-started")).returncode == 0


def test_node_commands_refuse_a_node_that_is_not_there_or_not_running(tmp_path: Path) -> None:
    fake_node(tmp_path / "node1", 1, 9001)
    missing = harness("cluster", "kill", str(tmp_path), "4")
    assert missing.returncode == 1 and "no node 4" in missing.stderr
    stopped = harness("cluster", "pause", str(tmp_path), "1")
    assert stopped.returncode == 1 and "not running" in stopped.stderr
    assert harness("cluster", "address", str(tmp_path / "nowhere")).returncode == 1
    usage = harness("cluster", "frobnicate", str(tmp_path))
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


def test_a_stopped_broker_has_no_address(tmp_path: Path) -> None:
    """The address is printed only while the broker runs: a stale one would point clients
    at a port somebody else may have taken."""
    fake_node(tmp_path, 1, 9092)
    result = harness("broker", "address", str(tmp_path))
    assert (result.returncode, result.stdout) == (1, "")
    assert "is not running" in result.stderr
