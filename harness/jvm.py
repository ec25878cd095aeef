"""Java processes on loopback: the jars fetched with Maven, free ports, one JVM per directory.

A JVM runs detached (its own session, so closing a terminal does not stop it) with its pid in
a file, so a later command (`make broker-stop`) can stop what an earlier one started.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STOP_TIMEOUT = 30.0
# Without a configuration Log4j 2 prints errors only; the log should show the whole story.
LOG4J = """\
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
"""
# A short-lived tool: the optimizing JIT and a parallel GC only slow its start.
FAST_TOOL = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
# The JVMs this process started: polled so a killed one is reaped, not left a zombie.
_children: dict[int, subprocess.Popen[bytes]] = {}


class HarnessError(RuntimeError):
    """A harness command that cannot do what it was asked; the message says why."""


def info(message: str) -> None:
    print(f"harness: {message}", file=sys.stderr, flush=True)


def require(*tools: str, why: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            raise HarnessError(f"'{tool}' not found on PATH ({why})")


def kafka_version() -> str:
    """KAFKA_VERSION in .env: the one place it is set (docker compose reads it too)."""
    env = REPO / ".env"
    found = re.search(r"^KAFKA_VERSION=([0-9][0-9.]*)$", env.read_text("utf-8"), re.MULTILINE)
    if found is None:
        raise HarnessError(f"no KAFKA_VERSION=X.Y.Z line in {env}")
    return found.group(1)


def kafka_jars() -> Path:
    """The directory the broker's jars are fetched into (KAFKA_CACHE_DIR overrides it)."""
    default = Path.home() / ".cache" / "context-assembler" / f"kafka-{kafka_version()}"
    return Path(os.environ.get("KAFKA_CACHE_DIR") or default)


def fetch_kafka() -> Path:
    """Download the broker's runtime jars once (deploy/kafka/pom.xml); returns their dir."""
    jars = kafka_jars()
    if (jars / ".complete").is_file():
        return jars
    version = kafka_version()
    require("mvn", why=f"Kafka {version} needs Java 17+ and Maven")
    info(f"downloading Kafka {version} jars into {jars}")
    jars.mkdir(parents=True, exist_ok=True)
    maven(["-f", str(REPO / "deploy" / "kafka" / "pom.xml"), "dependency:copy-dependencies",
           f"-Dkafka.version={version}", "-DincludeScope=runtime", f"-DoutputDirectory={jars}"],
          f"the Kafka {version} jars")
    (jars / ".complete").touch()
    return jars


def maven(args: Sequence[str], what: str) -> None:
    with tempfile.TemporaryFile() as log:
        if subprocess.run(["mvn", "-q", "-B", *args], stdout=log, stderr=log,
                          check=False).returncode != 0:
            log.seek(0)
            tail = log.read().decode("utf-8", "replace").splitlines()[-20:]
            print("\n".join(tail), file=sys.stderr)
            raise HarnessError(f"could not download {what}: is Maven Central reachable? "
                               "(proxies and mirrors go in ~/.m2/settings.xml)")


def free_ports(count: int) -> list[int]:
    """Loopback ports the kernel chose, free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cluster_id() -> str:
    """A Kafka-style base64 UUID; Kafka rejects ids that look like command-line flags."""
    found = "-"
    while found.startswith("-"):
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return found


class Jvm:
    """One Java process whose pid lives in `directory/<name>.pid` and output in its log."""

    def __init__(self, directory: Path, name: str, main_class: str) -> None:
        self.directory = directory
        self.pidfile = directory / f"{name}.pid"
        self.log = directory / f"{name}.log"
        self.main_class = main_class  # on its command line: a reused pid is not taken for it

    @property
    def pid(self) -> int:
        return int(self.pidfile.read_text().strip())

    def running(self) -> bool:
        """True while the pid file names a live (non-zombie) JVM of ours; a stopped one counts."""
        try:
            pid = self.pid
        except (OSError, ValueError):
            return False
        child = _children.get(pid)
        if child is not None:  # ours: its pid cannot be reused before we reap it
            return child.poll() is None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, IndexError):
            return False
        return stat != "Z" and self.main_class.encode() in cmdline

    def exit_status(self) -> str:
        """How a JVM this process started ended, for an error message."""
        try:
            child = _children.get(self.pid)
        except (OSError, ValueError):
            return "no pid file"
        if child is None:
            return "not a child of this process"
        if child.poll() is None:
            return "still running"
        if child.returncode < 0:
            return f"killed by {signal.Signals(-child.returncode).name}"
        return f"exit status {child.returncode}"

    def launch(self, command: Sequence[str], cwd: Path | None = None) -> None:
        with self.log.open("ab") as log:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       cwd=cwd, start_new_session=True)
        _children[process.pid] = process
        self.pidfile.write_text(f"{process.pid}\n")

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.pid, signum)

    def exited_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def stop(self) -> None:
        """SIGCONT (a paused JVM cannot exit) and SIGTERM, SIGKILL after 30 s; forget the pid."""
        if self.running():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        self.wait_stopped()

    def wait_stopped(self) -> None:
        if self.running() and not self.exited_within(STOP_TIMEOUT):
            info(f"{self.pid} ignored SIGTERM for {STOP_TIMEOUT:.0f} s; killing it")
            self.signal(signal.SIGKILL)
            if not self.exited_within(10):
                raise HarnessError(f"{self.pid} survived SIGKILL")
        self.pidfile.unlink(missing_ok=True)

    def first_errors(self, tail: int = 30) -> str:
        """The log's first ERROR/FATAL lines and its last lines, for a start that failed."""
        lines = self.log.read_text("utf-8", "replace").splitlines() if self.log.exists() else []
        errors = [line for line in lines if re.match(r"^\[[^]]*\] (ERROR|FATAL) ", line)][:5]
        return "\n".join([f"----- first errors in {self.log} -----", *errors,
                          f"----- tail of {self.log} -----", *lines[-tail:]])
