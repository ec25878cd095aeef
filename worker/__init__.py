"""Context Assembler: the engine (`worker.engine`), its intake, the file mode, the Kafka worker
and the command line. The version is the engine's: it is what every output records."""

from worker.engine.version import __version__

__all__ = ["__version__"]
