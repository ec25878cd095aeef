"""`python -m harness`: the brokers and the registry of the tests, for the Makefile, CI and the
docs. Commands that start something print what a client needs (an address, a URL) last, on
stdout; progress goes to stderr.

    python -m harness fetch                      the Kafka jars, once (Maven Central)
    python -m harness broker start DIR           a fresh single-node broker; prints host:port
    python -m harness broker stop DIR            SIGTERM, SIGKILL after 30 s; no-op if stopped
    python -m harness broker restart DIR         the same ports and data again
    python -m harness broker address DIR         host:port while it runs
    python -m harness cluster start DIR [N]      N nodes (3) in DIR/nodeK; prints the servers
    python -m harness cluster stop DIR
    python -m harness cluster address DIR        host:port,host:port,...
    python -m harness cluster pid|kill|pause|resume|restart DIR K     node K (its node.id)
    python -m harness registry fetch|java        Apicurio Registry, and the Java 21+ it needs
    python -m harness registry start|stop|restart|url DIR
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from harness.jvm import HarnessError, fetch_kafka
from harness.kafka import Cluster, LocalBroker
from harness.registry import Registry, fetch_registry, registry_java


class _Process(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def restart(self) -> None: ...
    def running(self) -> bool: ...


def _lifecycle(process: _Process, command: str, address: Callable[[], str],
               not_running: str) -> str | None:
    """start, stop or restart `process`, or (any other command) check that it runs; its
    address unless it was stopped."""
    if command == "start":
        process.start()
    elif command == "stop":
        process.stop()
        return None
    elif command == "restart":
        process.restart()
    elif not process.running():
        raise HarnessError(not_running)
    return address()


def broker(command: str, directory: Path) -> str | None:
    local = LocalBroker(directory)
    return _lifecycle(local, command, lambda: local.bootstrap_servers,
                      f"the broker of {directory} is not running (stopped, or it exited)")


def cluster(command: str, directory: Path, number: int | None) -> str | None:
    nodes = Cluster(directory, number or 3)
    node_commands: dict[str, Callable[[int], object]] = {
        "pid": nodes.pid, "kill": nodes.kill, "pause": nodes.pause, "resume": nodes.resume,
        "restart": nodes.restart}
    if command in node_commands:
        if number is None:
            raise HarnessError(f"cluster {command} needs a node number")
        found = node_commands[command](number)
        return str(found) if command == "pid" else None
    if command == "start":
        nodes.start()
    elif command == "stop":
        nodes.stop()
        return None
    return nodes.bootstrap_servers


def registry(command: str, directory: Path | None) -> str | None:
    if command == "fetch":
        fetch_registry()
        return None
    if command == "java":
        return registry_java()
    if directory is None:
        raise HarnessError(f"registry {command} needs a directory")
    process = Registry(directory)
    return _lifecycle(process, command, lambda: process.url,
                      f"the registry of {directory} is not running")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m harness", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    rooms = top.add_subparsers(dest="room", required=True)
    rooms.add_parser("fetch", help="download the Kafka jars once")
    single = rooms.add_parser("broker", help="a single-node broker")
    single.add_argument("command", choices=["start", "stop", "restart", "address"])
    single.add_argument("dir", type=Path)
    many = rooms.add_parser("cluster", help="a replicated cluster and its faults")
    many.add_argument("command", choices=["start", "stop", "address", "pid", "kill", "pause",
                                          "resume", "restart"])
    many.add_argument("dir", type=Path)
    many.add_argument("number", type=int, nargs="?", help="nodes to start, or the node")
    apicurio = rooms.add_parser("registry", help="a schema registry (Apicurio)")
    apicurio.add_argument("command", choices=["fetch", "java", "start", "stop", "restart", "url"])
    apicurio.add_argument("dir", type=Path, nargs="?")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.room == "fetch":
            fetch_kafka()
            printed = None
        elif args.room == "broker":
            printed = broker(args.command, args.dir)
        elif args.room == "cluster":
            printed = cluster(args.command, args.dir, args.number)
        else:
            printed = registry(args.command, args.dir)
    except HarnessError as error:
        print(f"harness: error: {error}", file=sys.stderr)
        return 1
    if printed is not None:
        print(printed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
