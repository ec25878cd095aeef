"""A real schema registry for integration tests: Apicurio Registry's Confluent-compatible API,
run by scripts/registry.sh from Maven Central (Java 21 or newer)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REGISTRY_SH = Path(__file__).resolve().parents[2] / "scripts" / "registry.sh"


class SchemaRegistryProcess:
    """One registry with its storage and log in `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible base URL (…/apis/ccompat/v7)."""
        if self._url is None:
            raise RuntimeError("the registry has not been started")
        return self._url

    def start(self) -> None:
        """A fresh registry on a free loopback port (20-40 s: a Quarkus app starting)."""
        self._url = self._registry_sh("start")

    def stop(self) -> None:
        self._registry_sh("stop")

    def restart(self) -> None:
        """Start it again on the same port with the schemas it held."""
        self._url = self._registry_sh("restart")

    def _registry_sh(self, command: str) -> str:
        result = subprocess.run(["bash", str(REGISTRY_SH), command, str(self.workdir)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"scripts/registry.sh {command} {self.workdir} failed "
                               f"(exit {result.returncode}):\n{result.stderr}")
        lines = result.stdout.strip().splitlines()
        return lines[-1] if lines else ""


@contextmanager
def running_registry(workdir: Path) -> Iterator[SchemaRegistryProcess]:
    registry = SchemaRegistryProcess(workdir)
    registry.start()
    try:
        yield registry
    finally:
        registry.stop()
