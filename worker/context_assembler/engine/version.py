"""The engine's version: in every output, so a replay can tell whether the rules changed."""

__version__ = "0.3.1"
