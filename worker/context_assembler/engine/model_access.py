"""The one place the engine reaches past the public API of pydantic models and named tuples.

Every chunk of an event is read a dozen times on its way through the stages, most of them
only to be dropped, so the hot path reads a validated model's fields from its `__dict__` in
one C call (an attribute of a model costs about twice as much) and builds each drop with
`tuple.__new__` (a NamedTuple's own `__new__` is a Python function). What this relies on is
checked by tests/engine/test_model_access.py, which fails loudly if a pydantic upgrade
changes it: that a model's `__dict__` holds every field by name, validated, and that
`chunk_document` answers as `Chunk.document`.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

T = TypeVar("T", bound=tuple[Any, ...])

# Every field of a validated model by name: pydantic v2 keeps them in the instance __dict__.
fields_of: Final[Callable[[BaseModel], dict[str, Any]]] = operator.attrgetter("__dict__")


def chunk_document(fields: dict[str, Any]) -> str:
    """`Chunk.document` from the chunk's `fields_of`: its doc_id, else its chunk_id."""
    document: str = fields["doc_id"] or fields["chunk_id"]
    return document


def tuple_maker(kind: type[T]) -> Callable[[Iterable[Any]], T]:
    """What builds a `kind` from its values in order, in C: the values are not checked."""
    return functools.partial(tuple.__new__, kind)
