"""A real schema registry with a Confluent-compatible API: Apicurio Registry (a Quarkus app)
from Maven Central, on loopback. It needs Java 21 or newer, which may not be the default java.

Storage is H2 in DIR/data, emptied by `start` and kept by `restart` (a registry that went down
comes back with its schemas).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.jvm import REPO, HarnessError, Jvm, free_ports, info, maven, require

APICURIO_VERSION = "3.3.3"
MIN_JAVA = 21
API = "/apis/ccompat/v7"
READY_TIMEOUT = float(os.environ.get("REGISTRY_READY_TIMEOUT", "180"))


def registry_home() -> Path:
    """The unpacked app (REGISTRY_CACHE_DIR overrides it)."""
    default = (Path.home() / ".cache" / "context-assembler"
               / f"apicurio-registry-{APICURIO_VERSION}")
    return Path(os.environ.get("REGISTRY_CACHE_DIR") or default)


def fetch_registry() -> Path:
    """Download and unpack the registry once (deploy/registry/pom.xml); returns its dir."""
    home = registry_home()
    if (home / ".complete").is_file():
        return home
    require("mvn", why="the registry is fetched from Maven Central")
    info(f"downloading Apicurio Registry {APICURIO_VERSION} into {home}")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    maven(["-f", str(REPO / "deploy" / "registry" / "pom.xml"), "dependency:unpack",
           f"-Dapicurio.version={APICURIO_VERSION}", f"-Dregistry.dir={home}"],
          f"Apicurio Registry {APICURIO_VERSION}")
    if not (home / "quarkus-run.jar").is_file():
        raise HarnessError(f"no quarkus-run.jar in {home}")
    (home / ".complete").touch()
    return home


def java_major(java: str) -> int | None:
    """The major version a java prints (1.8 -> 8), or None."""
    try:
        printed = subprocess.run([java, "-version"], capture_output=True, text=True,
                                 check=False, timeout=60).stderr
    except OSError:
        return None
    found = re.search(r' version "(?:1\.)?(\d+)', printed)
    return int(found.group(1)) if found else None


def registry_java() -> str:
    """The first java of version 21 or newer: REGISTRY_JAVA, JAVA_HOME's, the JVM folders'
    (Debian's /usr/lib/jvm, Red Hat's, macOS's), then PATH's."""
    home = os.environ.get("JAVA_HOME")
    candidates = [
        os.environ.get("REGISTRY_JAVA", ""), f"{home}/bin/java" if home else "",
        *sorted(glob.glob("/usr/lib/jvm/*/bin/java")), *sorted(glob.glob("/usr/java/*/bin/java")),
        *sorted(glob.glob("/Library/Java/JavaVirtualMachines/*/Contents/Home/bin/java")),
        shutil.which("java") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            major = java_major(candidate)
            if major is not None and major >= MIN_JAVA:
                return candidate
    raise HarnessError(f"no Java {MIN_JAVA} or newer found (Apicurio Registry "
                       f"{APICURIO_VERSION} needs one): install one (e.g. Temurin 21+) or point "
                       "REGISTRY_JAVA at its bin/java")


class Registry:
    """One registry with its storage, ports, log and pid in `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.absolute()
        self.jvm = Jvm(self.workdir, "registry", "quarkus-run.jar")

    @property
    def url(self) -> str:
        """The Confluent-compatible base URL (…/apis/ccompat/v7)."""
        port = self.workdir / "port"
        if not port.is_file():
            raise HarnessError(f"no registry was started in {self.workdir}")
        return f"http://127.0.0.1:{port.read_text().strip()}{API}"

    def running(self) -> bool:
        return self.jvm.running()

    def start(self) -> None:
        """A fresh registry on free loopback ports (20-40 s: a Quarkus app starting)."""
        if self.running():
            raise HarnessError(f"a registry is already running from {self.workdir} "
                               "(use restart or stop)")
        fetch_registry()
        self.workdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        self.jvm.log.unlink(missing_ok=True)
        api, management = free_ports(2)
        (self.workdir / "port").write_text(f"{api}\n")
        (self.workdir / "management-port").write_text(f"{management}\n")
        self._launch()

    def restart(self) -> None:
        """Start it again on the same port with the schemas it held."""
        if not (self.workdir / "port").is_file():
            raise HarnessError(f"no registry was started in {self.workdir}")
        self.stop()
        self._launch()

    def stop(self) -> None:
        self.jvm.stop()

    def _launch(self) -> None:
        """The API and the management interface (health and metrics, on every interface by
        default, and fixed on at build time) on loopback ports only."""
        management = (self.workdir / "management-port").read_text().strip()
        port = (self.workdir / "port").read_text().strip()
        self.jvm.launch([
            registry_java(), "-Xms64m", "-Xmx384m", "-Djava.awt.headless=true",
            "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={port}",
            "-Dquarkus.management.host=127.0.0.1", f"-Dquarkus.management.port={management}",
            f"-Dapicurio.datasource.url=jdbc:h2:file:{self.workdir}/data/registry",
            "-jar", "quarkus-run.jar"], cwd=registry_home())
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._answers():
            if not self.running() or time.monotonic() > deadline:
                log = self.jvm.first_errors()
                self.stop()
                raise HarnessError(f"{log}\nthe registry of {self.workdir} did not answer "
                                   f"within {READY_TIMEOUT:.0f} s")
            time.sleep(0.5)
        info(f"registry ready on {self.url} (pid {self.jvm.pid})")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=5) as reply:
                return int(reply.status) == 200
        except OSError:
            return False


@contextmanager
def running_registry(workdir: Path) -> Iterator[Registry]:
    registry = Registry(workdir)
    registry.start()
    try:
        yield registry
    finally:
        registry.stop()
