"""The shell blocks of the user documentation, run as a reader pastes them: each block alone
in a fresh `bash` started in the repository's directory after `make demo` (no venv active, no
`ASSEMBLER_*` variable set), and what each command prints compared with what the page shows.

What a page shows a command printing, and how it is compared:

- comment lines starting with `#   ` (a hash and three spaces) right after a command are its
  output, one line each (what follows the three spaces, indentation included);
- a `text` block that is the next fenced block after a shell block, in the same section
  (prose may come between), is part of what the whole block prints;
- shown lines must be consecutive lines of the output, in order; `…` stands for any text
  within a line, and a line that is only `…` for any number of lines (none included);
- a command must exit 0, unless the comment just above it says `exit status N`, and print no
  error the page does not show (`curl: (7) ...`, `make: *** ...`, a traceback).

Blocks that reach the development broker (`make broker-start`, `make -s broker-address`,
`make broker-stop`) run in one session against one broker: the block that starts it first,
the others in page order, the one that stops it last. `make test` is not run from inside the
tests it starts (CI runs it).
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.docs import REPO, Block, fenced_blocks, user_documents

ELLIPSIS = "…"
OUTPUT_PREFIX = "#   "
EXPECTED_STATUS = re.compile(r"exit status (\d+)")
BROKER = re.compile(r"make (?:-s )?broker-(?:start|address|stop)\b")
NOT_RUN_HERE = ("make test",)  # this suite itself
# Lines no page shows as a command's normal output: a failed attempt before the answer, a
# make target's failure.
UNSHOWN_ERRORS = re.compile(r"^(?:curl: \(\d+\)|make(?:\[\d+\])?: \*\*\*|Traceback )", re.MULTILINE)
MARKER = "\x1e"
# After each command: its exit status, on a line of its own whatever the command printed.
STATUS_LINE = re.compile(rf"\n?{MARKER}exit (\d+){MARKER}\n")


@dataclass(frozen=True)
class Command:
    text: str  # as written, continuation lines included
    shown: tuple[str, ...]  # the output the page shows after it
    status: int  # the exit status the page gives it


@dataclass(frozen=True)
class Ran:
    command: Command
    status: int
    output: str  # stdout and stderr as a terminal shows them, interleaved


@dataclass(frozen=True)
class BlockRun:
    block: Block
    commands: tuple[Ran, ...]

    @property
    def output(self) -> str:
        return "".join(ran.output for ran in self.commands)


def block_id(block: Block) -> str:
    """`docs/worker.md ## Quick start #1`: the page, the section and the block's place in it."""
    same = [b for b in fenced_blocks(block.document)
            if b.is_shell and b.headings == block.headings]
    return f"{block.document} {block.heading} #{same.index(block) + 1}"


def runnable_blocks(not_run: Mapping[tuple[str, str], object]) -> list[Block]:
    """Every shell block of the pages, but those in sections `not_run` names."""
    return [block for document in user_documents() for block in fenced_blocks(document)
            if block.is_shell and (block.document, block.heading) not in not_run]


def needs_the_broker(block: Block) -> bool:
    return BROKER.search(block.text) is not None


def broker_session(blocks: list[Block]) -> list[Block]:
    """The blocks on the development broker, in the order a reader runs them."""
    on_broker = [block for block in blocks if needs_the_broker(block)]

    def step(block: Block) -> int:
        starts = re.search(r"^make broker-start\b", block.text, re.MULTILINE)
        return 0 if starts else 2 if re.search(r"^make broker-stop\b", block.text, re.M) else 1

    return sorted(on_broker, key=step)  # stable: page order within each step


def shown_output(block: Block) -> list[str]:
    """The `text` block after `block`, when it is the next fenced block of its section."""
    blocks = fenced_blocks(block.document)
    index = blocks.index(block)
    after = blocks[index + 1] if index + 1 < len(blocks) else None
    if after is None or after.language != "text" or after.headings != block.headings:
        return []
    return after.text.splitlines()


def commands(text: str) -> list[Command]:
    """The commands of a block as bash reads them (a line, or several where bash needs more:
    a trailing backslash, an open quote, loop or here-document), each with what the page
    shows it printing and the exit status the comment above it gives."""
    lines = text.splitlines()
    found: list[Command] = []
    prose: list[str] = []
    after_command = False  # the lines since the last command were all its output
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.strip():
            prose, after_command = [], False
        elif line.lstrip().startswith("#"):
            if after_command and line.startswith(OUTPUT_PREFIX):
                last = found[-1]
                found[-1] = Command(last.text, (*last.shown, line[len(OUTPUT_PREFIX):]),
                                    last.status)
            else:
                prose.append(line)
                after_command = False
        else:
            written = [line]
            while _incomplete("\n".join(written)) and index < len(lines):
                written.append(lines[index])
                index += 1
            statuses = EXPECTED_STATUS.findall(" ".join(prose))
            found.append(Command("\n".join(written), (), int(statuses[-1]) if statuses else 0))
            prose, after_command = [], True
    return found


def _incomplete(text: str) -> bool:
    if text.endswith("\\"):
        return True
    check = subprocess.run(["bash", "-n"], input=text + "\n", capture_output=True, text=True,
                           timeout=30, check=False)
    return check.returncode != 0 or bool(check.stderr)


def fresh_shell_env(extra: Mapping[str, str] = {}) -> dict[str, str]:
    """A new terminal's environment: no venv on PATH or active, no ASSEMBLER_* setting, no
    broker directory; make does not reinstall the venv the tests run in."""
    venvs = {str(REPO / ".venv" / "bin"), os.path.join(os.environ.get("VIRTUAL_ENV", "-"), "bin")}
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("ASSEMBLER_", "VIRTUAL_ENV", "KAFKA_DIR", "MAKE"))}
    env["PATH"] = os.pathsep.join(part for part in env.get("PATH", "/usr/bin:/bin").split(
        os.pathsep) if part not in venvs)
    env["MAKEFLAGS"] = "-o .venv/bin/context-assembler"
    return {**env, **extra}


def script(block: Block) -> tuple[str, list[Command]]:
    """The block as bash runs it, each command followed by a line with its exit status."""
    found = commands(block.text)
    parts = []
    for command in found:
        skipped = command.text.split("#")[0].split()[:2] == NOT_RUN_HERE[0].split()
        parts.append(":" if skipped else command.text)
        parts.append(f"printf '\\n{MARKER}exit %d{MARKER}\\n' \"$?\"")
    parts.append("kill $(jobs -p) 2>/dev/null; wait")  # a job a failed block left running
    return "\n".join(parts) + "\n", found


def run_block(block: Block, env: Mapping[str, str], timeout: float = 300) -> BlockRun:
    """`block` alone in a fresh bash from the repository's directory."""
    text, found = script(block)
    with tempfile.TemporaryDirectory(prefix="doc-block-") as temp:
        path, log = Path(temp) / "block.bash", Path(temp) / "output"
        path.write_text(text, "utf-8")
        with log.open("wb") as sink:
            shell = subprocess.Popen(["bash", str(path)], cwd=REPO, env=dict(env),
                                     stdin=subprocess.DEVNULL, stdout=sink,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            try:
                shell.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(shell.pid, signal.SIGKILL)
                shell.wait()
        output = log.read_text("utf-8", "replace")
    pieces = STATUS_LINE.split(output)
    outputs, statuses = pieces[0::2], [int(status) for status in pieces[1::2]]
    if len(statuses) < len(found):
        raise AssertionError(f"{block_id(block)}: stopped (timeout {timeout} s?) after "
                             f"{len(statuses)} of {len(found)} commands:\n{output}")
    return BlockRun(block, tuple(Ran(command, status, out)
                                 for command, status, out in zip(found, statuses, outputs[:-1], strict=True)))


def shows(shown: list[str] | tuple[str, ...], output: str) -> bool:
    """Whether `shown` is consecutive lines of `output`, `…` standing for what varies."""
    if not shown:
        return True
    patterns = []
    for line in shown:
        if line.strip() == ELLIPSIS:
            patterns.append(r"(?:[^\n]*\n)*?")
        else:
            body = ".*?".join(re.escape(part) for part in line.rstrip().split(ELLIPSIS))
            patterns.append(rf"{body}[ \t]*\n")
    text = "\n" + "\n".join(row.rstrip() for row in output.splitlines()) + "\n"
    return re.search(r"(?<=\n)" + "".join(patterns), text) is not None


def problems(run: BlockRun) -> list[str]:
    """What differs between the page and what its block did: exit statuses, shown output."""
    found = []
    for ran in run.commands:
        if ran.status != ran.command.status:
            found.append(f"`{ran.command.text}` exited {ran.status}, the page says "
                         f"{ran.command.status}:\n{ran.output}")
        errors = [line for line in UNSHOWN_ERRORS.findall(ran.output)
                  if not any(shown.startswith(line) for shown in ran.command.shown)]
        if errors:
            found.append(f"`{ran.command.text}` printed errors the page does not show:\n"
                         f"{ran.output}")
        if not shows(ran.command.shown, ran.output):
            found.append(f"`{ran.command.text}` printed:\n{ran.output}\nthe page shows:\n"
                         + "\n".join(ran.command.shown))
    shown = shown_output(run.block)
    if not shows(shown, run.output):
        found.append(f"the block printed:\n{run.output}\nthe page shows after it:\n"
                     + "\n".join(shown))
    return found


@contextmanager
def one_at_a_time() -> Iterator[None]:
    """Blocks listen on fixed ports (serve's 8000): worktrees on one machine take turns."""
    with open(Path(tempfile.gettempdir()) / "context-assembler-doc-blocks.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
