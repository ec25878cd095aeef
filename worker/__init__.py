"""Context Assembler: the engine (`worker.engine`), the file-mode CLI and the Kafka worker."""

__version__ = "0.1.0"
