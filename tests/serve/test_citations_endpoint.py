"""`POST /v1/citations/check` on a real socket: the library's result, byte for byte; a JSON
reason for every refusal; the body bounded as an event's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

import context_assembler as ca
from context_assembler.engine.policy import policy_from_mapping
from context_assembler.generate.schemas import openapi
from context_assembler.intake.codec import encode
from context_assembler.intake.policy_registry import build_registry
from context_assembler.serve.app import CITATIONS_PATH, JSON, Server, Service
from tests.factories import example
from tests.serve.test_app import LIMITS, served_under


@pytest.fixture
async def url() -> AsyncIterator[str]:
    """The endpoint on a free port of 127.0.0.1."""
    running = Server(Service(build_registry(None, ["window-8k"]), served_under()), "127.0.0.1", 0)
    await running.start()
    try:
        yield f"http://127.0.0.1:{running.port}"
    finally:
        await running.stop()


def published(form: str = "messages") -> dict[str, Any]:
    policy = policy_from_mapping({"render": {"format": form}})
    prompt: dict[str, Any] = json.loads(encode(ca.assemble(example("q30-customer"), policy).prompt))
    return prompt


async def check(url: str, data: bytes, **headers: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
        f"{url}{CITATIONS_PATH}", data=data, headers={"Content-Type": JSON, **headers}
    ) as response:
        return response.status, json.loads(await response.read())


async def test_the_answer_is_checked_as_the_library_checks_it(url: str) -> None:
    prompt = published()
    for answer in ("Three years [wp-2-periods], and \uff3bS9\uff3d.",
                   {"message": {"content": [{"type": "text", "text": "ok"}],
                                "citations": [{"sources": [{"type": "document",
                                                            "id": "pw2400-winter"}]}]}}):
        status, body = await check(url, json.dumps({"prompt": prompt, "answer": answer}).encode())
        assert status == 200
        assert body == json.loads(encode(ca.check_citations(answer, prompt)))
    assert body["cited"][0]["label"] == "pw2400-winter"


async def test_a_refusal_names_its_reason(url: str) -> None:
    prompt = published("anthropic")
    cases: list[tuple[bytes, int, str]] = [
        (b"{", 400, "json"),
        (json.dumps({"prompt": {"request_id": "r"}, "answer": "x"}).encode(), 422, "schema"),
        (json.dumps({"prompt": prompt, "answer": {"choices": []}}).encode(), 422, "schema"),
        (json.dumps({"prompt": prompt, "answer": "[wp-2-periods]" * 5000}).encode(), 422,
         "limits"),
        (b" " * (2 * LIMITS.max_event_bytes + 1), 413, "limits"),
    ]
    for data, status, reason in cases:
        got, body = await check(url, data)
        assert (got, body["reason"]) == (status, reason), body
        assert set(body) == {"reason", "message", "request_id"}


def test_the_openapi_document_describes_the_check() -> None:
    document = openapi()
    operation = document["paths"][CITATIONS_PATH]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CitationRequest"}
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CitationCheck"}
    schemas = document["components"]["schemas"]
    assert set(schemas["CitationCheck"]["required"]) >= {"request_id", "cited", "invented",
                                                         "uncited"}
