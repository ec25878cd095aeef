"""Policy records: a record read back is the policy it records, or it is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_assembler.engine.policy import SEPARATOR_MARKS, Policy, policy_from_mapping
from context_assembler.intake.policy_registry import PolicyRegistry, load_preset
from context_assembler.intake.recorded_policies import (
    PinnedRegistry,
    PolicyNotRecorded,
    RecordedPolicies,
    differences,
    not_defaults,
    read_records,
    record_bytes,
    registry_policies,
)

OVERRIDES = st.fixed_dictionaries({}, optional={
    "budget": st.fixed_dictionaries({}, optional={
        "context_tokens": st.integers(1, 10_000), "safety_tokens": st.integers(0, 500),
        "history_share": st.floats(0, 1)}),
    "dedup": st.fixed_dictionaries({}, optional={
        "near_threshold": st.floats(0.01, 1), "same_document": st.sampled_from(["keep", "dedup"])}),
    "select": st.fixed_dictionaries({}, optional={
        "packing": st.sampled_from(["skip", "stop", "density", "mmr"]),
        "min_score": st.none() | st.floats(-1, 1), "max_chunks": st.none() | st.integers(1, 50)}),
    "order": st.fixed_dictionaries({}, optional={
        "mode": st.sampled_from(["rank", "edges", "first_last", "round_robin_source"])}),
    "render": st.fixed_dictionaries({}, optional={
        "separator": st.text(SEPARATOR_MARKS, max_size=4).map("\n".__add__), "system_prompt": st.text(max_size=40)}),
})


@given(OVERRIDES, st.text(min_size=1, max_size=20))
def test_a_record_read_back_is_the_policy_it_records(
    overrides: dict[str, dict[str, object]], name: str
) -> None:
    policy = policy_from_mapping(overrides, name=name)
    recorded = RecordedPolicies("t")
    recorded.add(policy.hash.encode(), record_bytes(policy))
    back = recorded.policy(policy.hash)
    assert back == policy and back.hash == policy.hash
    assert recorded.policy(policy.hash, "other").name == "other"


def test_each_policy_of_the_registry_is_recorded_as_requests_get_it() -> None:
    service = policy_from_mapping({"guard": {"unknown_audience": "allow"}}, name="service")
    registry = PolicyRegistry(service, [load_preset("window-8k"), load_preset("attention-edges")])
    policies = registry_policies(registry)
    assert [p.name for p in policies] == ["service", "attention-edges", "window-8k"]
    # An allowed policy's hash is the one its outputs carry: with the service's guard.
    assert [p.hash for p in policies] == [registry.resolve(p.name).hash for p in policies]
    assert policies[2].hash != load_preset("window-8k").hash


def test_a_pinned_registry_gives_its_policy_whatever_a_request_names() -> None:
    policy = load_preset("window-8k")
    pinned = PinnedRegistry(policy)
    assert pinned.resolve(None) is pinned.resolve("anything") is policy


def test_what_cannot_be_had_is_named() -> None:
    recorded = RecordedPolicies("topic pol")
    policy = Policy()
    with pytest.raises(PolicyNotRecorded, match=f"policy {policy.hash} is not recorded in "
                       "topic pol"):
        recorded.policy(policy.hash)
    recorded.add(policy.hash.encode(), b"{not json")
    with pytest.raises(PolicyNotRecorded, match="unusable: not a policy record"):
        recorded.policy(policy.hash)
    # A record under another policy's key: its rules do not hash to that key.
    other = load_preset("window-8k")
    recorded.add(policy.hash.encode(), record_bytes(other))
    with pytest.raises(PolicyNotRecorded, match=f"hash to {other.hash}"):
        recorded.policy(policy.hash)
    # Rules this engine does not know.
    unknown = json.loads(record_bytes(policy))
    unknown["settings"]["budget"]["elastic"] = True
    recorded.add(policy.hash.encode(), json.dumps(unknown).encode())
    with pytest.raises(PolicyNotRecorded, match="cannot read"):
        recorded.policy(policy.hash)


def test_a_later_record_replaces_and_a_tombstone_removes() -> None:
    policy = Policy()
    recorded = RecordedPolicies("t")
    recorded.add(policy.hash.encode(), b"junk")
    recorded.add(policy.hash.encode(), record_bytes(policy))
    assert recorded.policy(policy.hash) == policy
    recorded.add(policy.hash.encode(), None)
    assert len(recorded) == 0


def test_a_file_of_records_is_read_by_their_own_hashes() -> None:
    a, b = Policy(), load_preset("window-8k")
    recorded = read_records([record_bytes(a) + b"\n", b"\n", record_bytes(b)], "f.jsonl")
    assert recorded.policy(b.hash) == b and len(recorded) == 2
    with pytest.raises(PolicyNotRecorded, match=r"f\.jsonl:2: not a policy record"):
        read_records([record_bytes(a), b"[]"], "f.jsonl")


def test_differences_and_settings_off_the_defaults() -> None:
    old = policy_from_mapping({}, name="a")
    new = policy_from_mapping({"budget": {"context_tokens": 300}, "order": {"mode": "edges"}})
    assert differences(old.model_dump(mode="json"), new.model_dump(mode="json")) == [
        "budget.context_tokens: 1500 -> 300", 'name: "a" -> "default"',
        'order.mode: "rank" -> "edges"']
    recorded = RecordedPolicies("t")
    recorded.add(new.hash.encode(), record_bytes(new))
    assert not_defaults(recorded.record(new.hash)) == [
        "budget.context_tokens = 300 (default 1500)", 'order.mode = "edges" (default "rank")']
    recorded.add(old.hash.encode(), record_bytes(old))
    assert not_defaults(recorded.record(old.hash)) == []


def test_a_record_of_an_older_engine_differs_only_where_its_rules_do() -> None:
    """Before the first-line rule had three values and before charge_separators existed,
    the default policy's record said `drop_title_line = true` and nothing of separators."""
    older = Policy().model_dump(mode="json", exclude={"name"})
    older["dedup"]["drop_title_line"] = True
    del older["budget"]["charge_separators"]
    now = Policy().model_dump(mode="json", exclude={"name"})
    assert differences(older, now) == []
    tight = policy_from_mapping({"budget": {"context_tokens": 300}}).model_dump(
        mode="json", exclude={"name"})
    assert differences(older, tight) == ["budget.context_tokens: 1500 -> 300"]
    recorded = RecordedPolicies("t")
    recorded.add(Policy().hash.encode(), json.dumps({
        "name": "service", "hash": Policy().hash, "settings": older,
        "engine": {"version": "0.1.0"}}).encode())
    assert not_defaults(recorded.record(Policy().hash)) == []
