"""The embedded default: the engine over JSONL files, no broker.

One input line in gives one prompt line and one audit line out, in input order
(`intake.handle` turns each line's bytes into both, as it does for the Kafka worker). A line
that cannot be assembled becomes an error record with its origin (file:line) and the
reason, and the next line is processed.

Input lines are untrusted: a line over max_event_bytes is never held whole. Output files
are written beside their target and renamed into place at the end, and an output that
would overwrite an input or another output is refused before anything is opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO, Final

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.intake.codec import (
    RAW_KEPT_BYTES,
    Excerpt,
    Limits,
    RejectedInput,
    encode,
    encode_error_record,
)
from context_assembler.intake.handle import assemble_bytes
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.intake.recorded_policies import record_bytes, registry_policies

BOM: Final = b"\xef\xbb\xbf"
_SKIP_CHUNK: Final = 1 << 16  # an over-long line is consumed this many bytes at a time


def _without_terminator(line: bytes) -> bytes:
    return line[:-2] if line.endswith(b"\r\n") else line.removesuffix(b"\n")


def _skip_rest(stream: BinaryIO, start: bytes) -> Excerpt | None:
    """Consume an over-long line from `start` to its end, keeping only its Excerpt.

    None if the whole line is blank. A "\\r" ending a chunk is held back until the next
    chunk says whether it belongs to the terminator.
    """
    digest, length, head, blank = hashlib.sha256(), 0, b"", True
    held, piece = b"", start
    while True:
        ended = not piece or piece.endswith(b"\n")
        data, held = held + piece, b""
        if ended:
            data = _without_terminator(data)
        elif data.endswith(b"\r"):
            data, held = data[:-1], b"\r"
        digest.update(data)
        length += len(data)
        blank = blank and not data.strip()
        if len(head) <= RAW_KEPT_BYTES:
            head += data[: RAW_KEPT_BYTES + 1 - len(head)]
        if ended:
            return None if blank else Excerpt(head, length, f"sha256:{digest.hexdigest()}")
        piece = stream.readline(_SKIP_CHUNK)


def read_lines(stream: BinaryIO, max_bytes: int) -> Iterator[tuple[int, bytes | Excerpt]]:
    """(line number, line) for each non-blank line, without its "\\n" or "\\r\\n".

    At most `max_bytes` (and the terminator) of a line is ever held: a longer line comes
    out as an Excerpt, which `decode_event` rejects. A UTF-8 byte-order mark opening the
    stream is dropped.
    """
    number = 0
    while True:
        number += 1
        limit = max_bytes + len(b"\r\n") + (len(BOM) if number == 1 else 0)
        line = stream.readline(limit)
        if not line:
            return
        complete = line.endswith(b"\n") or len(line) < limit
        if number == 1:
            line = line.removeprefix(BOM)
        if not complete:
            excerpt = _skip_rest(stream, line)
            if excerpt is not None:
                yield number, excerpt
            continue
        data = _without_terminator(line)
        if data.strip():
            yield number, data


@dataclass
class Totals:
    assembled: int = 0
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def run(
    sources: Iterable[tuple[str, BinaryIO]],
    registry: PolicyRegistry,
    limits: Limits,
    *,
    prompts: BinaryIO,
    audits: BinaryIO | None,
    errors: BinaryIO,
) -> Totals:
    totals = Totals()
    for name, stream in sources:
        for number, line in read_lines(stream, limits.max_event_bytes):
            try:
                assembly = assemble_bytes(line, registry, limits)
            except RejectedInput as rejected:
                errors.write(encode_error_record(rejected.record(f"{name}:{number}", line)) + b"\n")
                totals.rejected += 1
                totals.reasons[rejected.reason] = totals.reasons.get(rejected.reason, 0) + 1
                continue
            prompts.write(encode(assembly.prompt) + b"\n")
            if audits is not None:
                audits.write(encode(assembly.audit) + b"\n")
            totals.assembled += 1
    return totals


def write_policies(registry: PolicyRegistry, stream: BinaryIO) -> None:
    """One record per policy `registry` assembles under, as the worker publishes them on its
    policies topic: what `replay --policy recorded --policies F` reads."""
    for policy in registry_policies(registry):
        stream.write(record_bytes(policy) + b"\n")


class OutputConflict(ContextAssemblerError):
    """An output that would overwrite an input or another output."""


Place = str | int  # a path, or the file descriptor "-" stands for (0, 1 or 2)
_STREAMS: Final = {0: "stdin", 1: "stdout", 2: "stderr"}


def _identities(place: Place) -> set[tuple[object, ...]]:
    """Names under which two places are one file: the descriptor of a stream, device and
    inode of a regular file, the resolved path of a file not yet created. Devices and pipes
    (/dev/null, a process substitution) hold nothing to overwrite and have no other name."""
    if isinstance(place, int):
        found: set[tuple[object, ...]] = {("stream", place)}
        with contextlib.suppress(OSError):  # a closed stream: writing will say so
            info = os.fstat(place)
            if stat.S_ISREG(info.st_mode):
                found.add(("file", info.st_dev, info.st_ino))
        return found
    try:
        info = os.stat(place)
    except FileNotFoundError:
        return {("path", os.path.realpath(place))}
    except OSError:  # unreadable: opening it will say why
        return set()
    return {("file", info.st_dev, info.st_ino)} if stat.S_ISREG(info.st_mode) else set()


def _shown(place: Place) -> str:
    return _STREAMS.get(place, str(place)) if isinstance(place, int) else place


def refuse_overlaps(inputs: Iterable[Place], outputs: Mapping[str, Place]) -> None:
    """Raise OutputConflict if an output (option -> place) is an input or another output.

    Same path, symlink or hard link all count. stdout and stderr may share a file (as
    after `2>&1`): they append to one offset instead of overwriting each other.
    """
    claims: dict[tuple[object, ...], tuple[str, Place]] = {}
    for place in inputs:
        for identity in _identities(place):
            claims.setdefault(identity, ("the input", place))
    for option, place in outputs.items():
        for identity in _identities(place):
            claimed = claims.get(identity)
            if claimed is None:
                claims[identity] = (option, place)
                continue
            owner, other = claimed
            if owner != "the input" and isinstance(place, int) and isinstance(other, int):
                if place != other:
                    continue
                raise OutputConflict(
                    f"{option} and {owner} would both write to {_shown(place)}, one kind of "
                    "record mixed into the other; give one of them a file name"
                )
            raise OutputConflict(
                f"{option} {_shown(place)} is the same file as {owner} {_shown(other)}; "
                "refusing to overwrite it (nothing was written)"
            )


@contextlib.contextmanager
def output_file(path: str) -> Iterator[BinaryIO]:
    """`path`, written whole or not at all: into a temporary file beside its target, renamed
    over it at the end and removed on any failure (Ctrl-C included). A symlink keeps
    pointing at its target; a device or pipe is written directly."""
    target = os.path.realpath(path)
    try:
        existing: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        with open(path, "wb") as stream:
            yield stream
        return
    folder, name = os.path.split(target)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as error:
        raise OSError(error.errno, error.strerror, path) from None
    try:
        with os.fdopen(descriptor, "wb") as stream:
            if existing is not None:
                os.fchmod(descriptor, stat.S_IMODE(existing.st_mode))
            yield stream
            stream.flush()
            os.fsync(descriptor)  # the rename must not publish a file still in the page cache
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
