"""The root of every error this project raises on purpose.

Like aiokafka's `KafkaError`, one base lets a shell (the CLI, the worker's start-up) catch
"a problem we can explain" in one place and leave real bugs to surface as bugs.
"""

from __future__ import annotations


class ContextAssemblerError(Exception):
    """A problem with a message fit for the operator: bad policy, settings or vocabulary."""
