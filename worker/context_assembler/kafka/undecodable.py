"""Compressed record batches that cannot be decoded, said in one line.

aiokafka decodes gzip with the standard library and snappy, lz4 and zstd with cramjam, which
this package installs (aiokafka's codec extras). An image built without it, or a batch of a
codec no client knows, raises UnsupportedCodecError out of a consumer's fetch: faust's
fetcher crashed on it, and a restarted worker crashed again on the same batch. The worker
instead stops reading and says why on /ready (`EventRunner.cannot_decode`), the commands
that read topics stop with the same reason (`Undecodable`).
"""

from __future__ import annotations

import re

from aiokafka.errors import UnsupportedCodecError

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.settings import CODEC_PACKAGE, INSTALL

_MISSING = re.compile(r"Libraries for (\w+) compression codec not found")


class Undecodable(ContextAssemblerError):
    """Records a command was asked to read are compressed with a codec it cannot decode."""


def undecodable(error: UnsupportedCodecError, topic: str) -> str:
    """What an operator needs to know: the codec, the package missing, how to install it."""
    missing = _MISSING.search(str(error))
    if missing is not None:
        return (f"cannot decode {missing[1]}-compressed records of {topic}: the "
                f"{CODEC_PACKAGE} package is not installed ({INSTALL})")
    return f"cannot decode records of {topic}: {error}"

