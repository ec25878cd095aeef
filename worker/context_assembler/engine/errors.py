"""The root of every error this project raises on purpose, and the engine's own errors.

Like aiokafka's `KafkaError`, one base lets a shell (the CLI, the worker's start-up) catch
"a problem we can explain" in one place and leave real bugs to surface as bugs. The intake
turns the engine's errors about one event into a `RejectedInput` (itself one of the family);
the others stop the process at start.
"""

from __future__ import annotations


class ContextAssemblerError(Exception):
    """A problem with a message fit for the operator: bad policy, settings or vocabulary."""


class PolicyError(ContextAssemblerError, ValueError):
    """A policy that cannot be used, or that a request may not name, with every problem
    spelled out."""


class WrongArgument(ContextAssemblerError, TypeError):
    """A library function given an argument of another type than it takes (a str for a
    RetrievalResult, say): one of the family, as docs/library.md promises, not an
    AttributeError from deep inside the engine."""


class PromptTooLarge(ContextAssemblerError, ValueError):
    """Even without passages the prompt exceeds window - max_output: nothing can fix that."""


class SpecialTokenInId(ContextAssemblerError, ValueError):
    """A chunk_id or doc_id that spells one of the tokenizer's added tokens where it is
    printed: an identifier is cited as sent, so it cannot be defused, only refused."""


class VocabularyUnavailable(ContextAssemblerError, RuntimeError):
    """A tokenizer's vocabulary is neither cached nor bundled: the message says how to
    provide it."""


class InvalidEvent(ContextAssemblerError, ValueError):
    """A mapping given for a RetrievalResult that is not one: the message lists each problem."""


class UnreadableAnswer(ContextAssemblerError, ValueError):
    """An answer (or the prompt it answers) the citation check cannot read: not text, not a
    provider response it knows, over its size bounds, or a prompt that is not one."""


class AnswerTooLarge(UnreadableAnswer):
    """An answer over the check's bounds: its size, its citations, or what its result
    would weigh."""
