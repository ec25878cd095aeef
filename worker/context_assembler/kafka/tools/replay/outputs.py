"""Where a replay writes: its output files, written whole or not at all, and a progress bar."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from context_assembler.filemode import output_file
from context_assembler.intake.codec import encode, encode_error_record
from context_assembler.kafka.records import Origin, Outcome


@dataclass(frozen=True, slots=True)
class OutputFiles:
    """One JSON line per replayed event in each file asked for: its prompt and audit, or,
    if it was rejected, its error record (as the file mode writes them)."""

    prompts: BinaryIO | None = None
    audits: BinaryIO | None = None
    errors: BinaryIO | None = None

    def write(self, outcome: Outcome, origin: Origin, raw: bytes) -> None:
        if outcome.assembly is not None:
            for stream, model in ((self.prompts, outcome.assembly.prompt),
                                  (self.audits, outcome.assembly.audit)):
                if stream is not None:
                    stream.write(encode(model) + b"\n")
        elif outcome.rejected is not None and self.errors is not None:
            record = outcome.rejected.record(str(origin), raw)
            self.errors.write(encode_error_record(record) + b"\n")


@contextmanager
def output_files(
    prompts: Path | None, audits: Path | None, errors: Path | None
) -> Iterator[OutputFiles]:
    """The files given, each written beside its target and renamed into place when the
    block ends (`context_assembler.filemode.output_file`); if the block fails, none is."""
    with ExitStack() as stack:

        def opened(path: Path | None) -> BinaryIO | None:
            return None if path is None else stack.enter_context(output_file(str(path)))

        yield OutputFiles(opened(prompts), opened(audits), opened(errors))


class Progress:
    """A one-line progress bar with rate and ETA, only when `stream` (stderr) is a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self._stream = stream or sys.stderr
        self._started = time.monotonic()
        self._shown = 0.0
        self._enabled = self._stream.isatty()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self._enabled and (now - self._shown > 0.2 or self.done == self.total):
            self._shown = now
            rate = self.done / max(now - self._started, 1e-9)
            eta = (self.total - self.done) / rate if rate else 0
            share = self.done / self.total if self.total else 1
            bar = "#" * int(share * 30)
            print(f"\r[{bar:<30}] {self.done}/{self.total} {rate:6.0f} events/s ETA {eta:4.0f}s",
                  end="", file=self._stream, flush=True)

    def close(self) -> None:
        if self._enabled:
            print(file=self._stream)
