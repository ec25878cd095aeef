"""Operator files (policy TOML, tokenizer.json, policy records): the one way they are read.

They are trusted, but an operator can still name the wrong thing, and the process must then
stop at start with one clear line instead of hanging or running out of memory. So a file is
read whole only if it is a regular file (or a symlink to one, as a mounted ConfigMap is) and
no larger than its kind's limit: a FIFO would block the start forever and a device such as
/dev/zero would be read until memory runs out.
"""

from __future__ import annotations

import os
import stat
from typing import Final

from context_assembler.engine.errors import ContextAssemblerError

MIB: Final = 2**20
_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class OperatorFileError(ContextAssemblerError):
    """An operator file that cannot be read whole: missing, not a regular file, too large."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_operator_file(path: str | os.PathLike[str], what: str, limit: int) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them; OperatorFileError
    (naming `what` and the path) otherwise. Opening never waits for a FIFO's writer."""
    shown = os.fspath(path)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except ValueError:  # os.open refuses a NUL in a path before any system call
        raise OperatorFileError(f"{what} {shown!r}: a file name cannot hold a NUL") from None
    except OSError as error:
        raise OperatorFileError(f"{what} {shown}: cannot read it ({error.strerror})") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise OperatorFileError(f"{what} {shown}: is {_kind(mode)}, not a regular file")
    with os.fdopen(descriptor, "rb") as stream:
        try:
            data = stream.read(limit + 1)  # + 1: a file still growing is caught too
        except OSError as error:
            raise OperatorFileError(f"{what} {shown}: cannot read it ({error.strerror})") from None
    if len(data) > limit:
        raise OperatorFileError(f"{what} {shown}: larger than its limit of {_size(limit)}")
    return data


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit % MIB == 0 else f"{limit:,} bytes"
