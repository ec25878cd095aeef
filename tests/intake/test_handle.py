"""The one way in from bytes: an Assembly, or a RejectedInput with its reason and request_id."""

from __future__ import annotations

import json

import pytest

from context_assembler.contract.models import RejectReason, RetrievalResult
from context_assembler.engine import Policy, assemble, policy_from_mapping
from context_assembler.intake import handle
from context_assembler.intake.codec import Limits, RejectedInput, encode
from context_assembler.intake.handle import assemble_bytes, resolve_policy
from context_assembler.intake.policy_registry import PolicyRegistry, load_preset
from tests.factories import EXAMPLES

GOOD = (EXAMPLES / "events.jsonl").read_bytes().splitlines()
FIRST = json.loads(GOOD[0])


def line(**changes: object) -> bytes:
    return json.dumps({**FIRST, **changes}).encode()


def rejected(raw: bytes, registry: PolicyRegistry) -> RejectedInput:
    with pytest.raises(RejectedInput) as caught:
        assemble_bytes(raw, registry, Limits())
    return caught.value


def test_good_bytes_give_the_assembly_the_engine_gives() -> None:
    policy = Policy()
    assembly = assemble_bytes(GOOD[0], PolicyRegistry(policy), Limits())
    event = RetrievalResult.model_validate_json(GOOD[0])
    assert encode(assembly.prompt) == encode(assemble(event, policy).prompt)


def test_a_policy_the_operator_did_not_allow_is_rejected_with_the_request_id() -> None:
    error = rejected(line(request_id="r1", policy="rank-fidelity"), PolicyRegistry(Policy()))
    assert (error.reason, error.request_id) == (RejectReason.POLICY, "r1")
    assert error.message == "policy 'rank-fidelity' is not allowed here; allowed: default"
    event = RetrievalResult.model_validate_json(line(policy="window-8k"))
    assert resolve_policy(PolicyRegistry(Policy(), [load_preset("window-8k")]), event).name == (
        "window-8k")


def test_a_question_that_alone_overflows_the_window_is_a_budget_rejection() -> None:
    tiny = policy_from_mapping({"budget": {"window": 300, "max_output": 100}}, name="tiny")
    error = rejected(line(request_id="r2", question="pump " * 400), PolicyRegistry(tiny))
    assert (error.reason, error.request_id) == (RejectReason.BUDGET, "r2")
    assert error.message.startswith("instructions and question alone do not fit")


def test_an_engine_bug_costs_one_event_as_an_engine_rejection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(event: RetrievalResult, policy: Policy) -> None:
        raise KeyError(41)

    monkeypatch.setattr(handle, "assemble", broken)
    error = rejected(line(request_id="r3"), PolicyRegistry(Policy()))
    assert (error.reason, error.request_id, error.message) == (
        RejectReason.ENGINE, "r3", "KeyError: 41")
    assert isinstance(error.__cause__, KeyError)


def test_bytes_that_do_not_decode_are_rejected_by_the_codec() -> None:
    error = rejected(b"{not json", PolicyRegistry(Policy()))
    assert (error.reason, error.request_id) == (RejectReason.JSON, None)
