"""What the commands share: their errors, options, input and output files, and stderr notes.

An error the operator can fix is raised as a `ContextAssemblerError`, which `main` reports
in one line with exit status 2; the ones defined here are the command line's own.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO, Final, Literal, TypeVar, get_args, get_origin

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from context_assembler import filemode
from context_assembler.cli.settings_flags import (
    COMMANDS,
    command_flag,
    command_options,
    shown_default,
)
from context_assembler.contract.models import AssemblyAudit
from context_assembler.diagnose.explain import UnusableInput, printable
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.settings import (
    Flag,
    Settings,
    load_settings,
    unknown_variables,
    variable_of,
)

_Number = TypeVar("_Number", int, float)


class UsageError(ContextAssemblerError):
    """Options that do not go together, or one a command needs and was not given."""


class NotFound(ContextAssemblerError):
    """A request the command was asked about is not where it was told to look."""


class FileError(ContextAssemblerError):
    """A file or stream the command cannot open, read or write: the OSError's message, with
    the path when the OSError does not name it."""


class ClosedStream(FileError, OSError):
    """A standard stream the process was started without, which the command needed."""


class _Missing(io.TextIOBase):
    """Stands for a standard stream the process was started without. Python leaves such a
    stream None, and print() then writes to stdout: diagnostics among the prompts. Reading or
    writing it is a ClosedStream, except notes on stderr, which are dropped."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.stream = name

    def _closed(self) -> ClosedStream:
        return ClosedStream(f"{self.stream} is closed (the command was started without it); "
                            "open it, or name a file instead")

    @property
    def buffer(self) -> BinaryIO:
        raise self._closed()

    def write(self, text: str) -> int:
        if self.stream == "stderr":
            return len(text)  # a note with nowhere to go; never on stdout
        raise self._closed()

    def read(self, size: int | None = -1) -> str:
        raise self._closed()


def stand_in_for_closed_streams() -> None:
    """Each standard stream the process was started without becomes a `_Missing`, and its
    descriptor /dev/null, so that no file the command opens takes its number."""
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        if getattr(sys, name) is not None:
            continue
        stand_in = os.open(os.devnull, os.O_RDWR)
        if stand_in != number:
            os.dup2(stand_in, number)
            os.close(stand_in)
        setattr(sys, name, _Missing(name))


@contextlib.contextmanager
def file_errors(path: str | None = None) -> Iterator[None]:
    """Raise an OSError from within as a FileError naming `path`."""
    try:
        yield
    except OSError as error:
        named = error.filename is not None or path is None
        raise FileError(str(error) if named else f"{path}: {error}") from error


Command = Callable[[argparse.Namespace, Settings], int]


def command(run: Command) -> Command:
    """A command whose OSErrors (a file it cannot open, a closed pipe) are FileErrors: the
    operator's to fix, not a bug."""

    @functools.wraps(run)
    def reporting(args: argparse.Namespace, settings: Settings) -> int:
        with file_errors():
            return run(args, settings)

    return reporting


def note(text: str) -> None:
    """One line on stderr; `text` may quote an event, so its control characters are escaped."""
    print(printable(text), file=sys.stderr)


# Options: the settings each command reads (`settings_flags.COMMANDS`), and the
# numbers of its own arguments.


def add_settings(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of the settings `command` reads. A flag not given stays out of the
    namespace, so the setting's variable, else its default, applies (`read_settings`)."""
    parser.set_defaults(settings_of=command)
    for name in COMMANDS[command]:
        flag = command_flag(name, command)
        if flag is None:
            continue
        field = Settings.model_fields[name]
        about = f"{field.description} ({variable_of(name)}; default: {shown_default(field)})"
        parser.add_argument(
            flag.option, dest=name, default=argparse.SUPPRESS,
            action="append" if flag.repeatable else "store",
            metavar=_metavar(flag, field),
            help=about.replace("%", "%%"),  # argparse formats help with %
        )


def _metavar(flag: Flag, field: FieldInfo) -> str:
    """The choices of a setting that has a few, else its flag's name in capitals."""
    if get_origin(field.annotation) is Literal:
        return "{" + ",".join(get_args(field.annotation)) + "}"
    return flag.option.lstrip("-").replace("-", "_").upper()


def read_settings(args: argparse.Namespace) -> Settings:
    """The settings of the command `args` were parsed for: its flags given, over the
    environment, over the defaults."""
    given = {name: value for name, value in vars(args).items() if name in Settings.model_fields}
    settings = load_settings(given, command_options(args.settings_of))
    if args.settings_of != "worker":  # the worker logs them, as JSON lines
        for warning in unknown_variables(os.environ):
            note(f"context-assembler: warning: {warning}")
    return settings


def _number(text: str, parse: Callable[[str], _Number], fits: Callable[[_Number], bool],
            expected: str) -> _Number:
    """`text` as a number that fits, or the option's usage error (exit 2)."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return value


def positive(text: str) -> int:
    return _number(text, int, lambda value: value >= 1, "a positive whole number")


def add_range(parser: argparse.ArgumentParser, partition: str = "partition") -> None:
    """--from, --from-time and --to: the records of a topic to read (replay, redrive)."""
    parser.add_argument("--from", dest="start", action="append", default=[], metavar="P:OFFSET",
                        help=f"start of one {partition} (repeatable)")
    parser.add_argument("--from-time", help=f"start of every {partition} at this ISO-8601 time")
    parser.add_argument("--to", action="append", default=[], metavar="P:OFFSET|TIME",
                        help="end (exclusive): an offset of a partition, or an ISO-8601 time")


# Input and output files. "-" is stdin for an input, and stdout or stderr for an output.

STDOUT, STDERR = 1, 2
_STREAM_OF = {"--out": STDOUT, "--audit": STDOUT, "--errors": STDERR}
# Events run to ~100 KB a line: a buffer that holds one reads it in one system call
# (bench/README.md has what a small one cost).
INPUT_BUFFER: Final = 2**20


@contextlib.contextmanager
def open_inputs(paths: Sequence[str]) -> Iterator[list[tuple[str, BinaryIO]]]:
    """(name, stream) for each path, stdin if none."""
    with contextlib.ExitStack() as stack:
        sources: list[tuple[str, BinaryIO]] = []
        for path in paths or ["-"]:
            if path == "-":
                sources.append(("<stdin>", sys.stdin.buffer))
            else:
                with file_errors(path):
                    stream = stack.enter_context(open(path, "rb", buffering=INPUT_BUFFER))
                    sources.append((path, stream))
        yield sources


@contextlib.contextmanager
def open_output(option: str, path: str | None) -> Iterator[BinaryIO | None]:
    """None: not written; "-": stdout or stderr, as it goes; a path: written whole at the end."""
    if path is None:
        yield None
    elif path == "-":
        yield sys.stdout.buffer if _STREAM_OF[option] == STDOUT else sys.stderr.buffer
    else:
        with contextlib.ExitStack() as stack:
            with file_errors(path):
                stream = stack.enter_context(filemode.output_file(path))
            yield stream
            with file_errors(path):
                stack.close()  # flushed, synced and renamed into place


def refuse_overlaps(inputs: Sequence[str], outputs: dict[str, str | None]) -> None:
    """Before anything is read or written: no output may be an input or another output."""
    filemode.refuse_overlaps(
        [0 if path == "-" else path for path in inputs],
        {option: _STREAM_OF[option] if path == "-" else path
         for option, path in outputs.items() if path is not None},
    )


def parse_audit(data: bytes | str, where: str) -> AssemblyAudit:
    try:
        return AssemblyAudit.model_validate_json(data)
    except ValidationError as error:
        problem = error.errors()[0]
        place = ".".join(str(p) for p in problem["loc"]) or "<root>"
        raise UnusableInput(f"{where}: not an AssemblyAudit: {place}: {problem['msg']}") from None
