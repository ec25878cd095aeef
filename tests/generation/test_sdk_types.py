"""The provider requests against the SDKs' own type definitions: every key we send is one
the SDK's type declares, every key it requires is there, and every value has the declared
type (Anthropic's TypedDicts, Cohere's pydantic models), for every format-specific shape
the engine writes (passages, abstention, history)."""

from __future__ import annotations

import collections.abc
import inspect
import json
import types
import typing
from typing import Any, Literal, Required, Union, get_args, get_origin, get_type_hints

import anthropic.types
import cohere
import pytest
import typing_extensions
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from pydantic import BaseModel
from typing_extensions import is_typeddict

from tests.generation.test_provider_sdks import events, published

_LISTS = {list, collections.abc.Iterable, collections.abc.Sequence}
_MAPS = {dict, collections.abc.Mapping}


def conforms(value: Any, declared: Any) -> bool:
    """Whether `value` (decoded JSON) is one of the values `declared` allows."""
    origin, args = get_origin(declared), get_args(declared)
    if declared is Any or declared is object:
        return True
    if origin in (Union, types.UnionType):
        return any(conforms(value, arg) for arg in args)
    if origin is Literal:
        return value in args
    if origin is typing.Annotated:
        return conforms(value, args[0])
    if is_typeddict(declared):
        hints = get_type_hints(declared)
        return (isinstance(value, dict) and set(value) <= set(hints)
                and _required(declared) <= set(value)
                and all(conforms(item, hints[key]) for key, item in value.items()))
    if isinstance(declared, type) and issubclass(declared, BaseModel):
        fields = declared.model_fields
        required = {name for name, field in fields.items() if field.is_required()}
        return (isinstance(value, dict) and set(value) <= set(fields)
                and required <= set(value)
                and all(conforms(item, fields[key].annotation) for key, item in value.items()))
    if origin in _LISTS:
        return isinstance(value, list) and all(conforms(item, args[0]) for item in value)
    if origin in _MAPS:
        return isinstance(value, dict) and all(conforms(item, args[1]) for item in value.values())
    if declared is type(None):
        return value is None
    if declared in (str, bool):
        return type(value) is declared
    if declared is int:
        return type(value) is int
    return False  # a type no value we send can be: only another branch may match


def _required(declared: Any) -> set[str]:
    """The keys a TypedDict requires: `Required[...]` ones (which `__required_keys__`
    misses under postponed annotations on this Python) and those of a total class."""
    marked = {key for key, hint in get_type_hints(declared, include_extras=True).items()
              if get_origin(hint) in (Required, typing_extensions.Required)}
    return marked | set(declared.__required_keys__)


@pytest.mark.parametrize("event", events(), ids=lambda event: event["request_id"])
def test_the_anthropic_request_is_a_message_create_params_of_the_sdk(
    event: dict[str, Any]
) -> None:
    request = published(event, "anthropic")["provider_request"]
    body = {"model": "claude-test", "max_tokens": 512, **request}
    assert conforms(body, MessageCreateParamsNonStreaming), json.dumps(request)
    search_results = [block for message in request["messages"]
                      if isinstance(message["content"], list)
                      for block in message["content"] if block["type"] == "search_result"]
    for block in search_results:  # each one as the SDK's own search result block
        assert conforms(block, anthropic.types.SearchResultBlockParam)
        assert block["citations"] == {"enabled": True}


@pytest.mark.parametrize("event", events(), ids=lambda event: event["request_id"])
def test_the_cohere_request_is_what_the_sdks_chat_takes(event: dict[str, Any]) -> None:
    request = published(event, "cohere")["provider_request"]
    chat = inspect.signature(cohere.ClientV2.chat).parameters
    assert set(request) <= set(chat)
    assert all(conforms(message, cohere.ChatMessageV2) for message in request["messages"])
    assert all(conforms(document, cohere.Document) for document in request["documents"])
    assert request["messages"][0]["role"] == "system"


def test_the_check_itself_refuses_what_the_sdks_do_not_declare() -> None:
    """The walk above can fail: an unknown key, a missing one, a wrong value."""
    block = {"type": "search_result", "source": "s", "title": "t",
             "content": [{"type": "text", "text": "x"}], "citations": {"enabled": True}}
    assert conforms(block, anthropic.types.SearchResultBlockParam)
    assert not conforms({**block, "label": "x"}, anthropic.types.SearchResultBlockParam)
    assert not conforms({k: v for k, v in block.items() if k != "title"},
                        anthropic.types.SearchResultBlockParam)
    assert not conforms({**block, "content": "x"}, anthropic.types.SearchResultBlockParam)
    assert not conforms({"id": "a", "text": "x"}, cohere.Document)
