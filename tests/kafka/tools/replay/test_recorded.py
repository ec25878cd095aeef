"""Replay under the recorded policies, over in-memory topics: each event under the policy its
published prompt names, found on the policies topic or in a file; a hash not recorded stops
the replay before anything is written.

Against a real worker restarted under another policy: tests/integration/test_recorded_policy.py.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from context_assembler.intake.policy_registry import PolicyRegistry, build_registry
from context_assembler.intake.recorded_policies import (
    PolicyNotRecorded,
    RecordedPolicies,
    record_bytes,
    registry_policies,
)
from context_assembler.kafka.records import HandlerContext, Origin, handle
from context_assembler.kafka.tools.replay import replay as module
from context_assembler.kafka.tools.replay.replay import ReplayRequest, replay
from context_assembler.settings import Settings
from harness.worker import ALLOWED_POLICIES, events, file_mode
from tests.kafka.tools.replay.fakes import FakeReader, Topics

T = 1_764_547_200_000
GOOD = events(8)


def tight(tmp_path: Path) -> PolicyRegistry:
    path = tmp_path / "tight.toml"
    path.write_text('name = "tight"\n[budget]\ncontext_tokens = 300\n')
    return build_registry(str(path), ALLOWED_POLICIES)


def worker_run(topics: Topics, registry: PolicyRegistry, lines: list[bytes], start: int) -> None:
    """A worker under `registry`: its policies on "pol", then each event in, prompt and
    audit out (every event on partition 0)."""
    for policy in registry_policies(registry):
        topics.append("pol", 0, record_bytes(policy), key=policy.hash.encode())
    context = HandlerContext(
        settings=Settings(input_topic="in", prompts_topic="p", audit_topic="a", dlq_topic="d"),
        registry=registry)
    for n, raw in enumerate(lines, start=start):
        topics.append("in", 0, raw, timestamp=T + n)
        found = topics.partition("in", 0)[-1]
        for out in handle(raw, Origin.from_record(found), context).records:
            topics.append(out.topic, 0, out.value, key=out.key, headers=out.headers,
                          timestamp=T + n)


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Topics:
    """The first four events under the default policy, the next four under "tight"."""
    topics = Topics()
    worker_run(topics, build_registry(None, ALLOWED_POLICIES), GOOD[:4], 0)
    worker_run(topics, tight(tmp_path), GOOD[4:], 4)
    for topic in ("p", "a", "d"):
        topics.partition(topic, 0)
    monkeypatch.setattr(module, "TopicReader", lambda clients: FakeReader(topics))
    return topics


def request(registry: PolicyRegistry | None = None, **fields: Any) -> ReplayRequest:
    settings = Settings(bootstrap_servers="fake:9092", input_topic="in", prompts_topic="p",
                        audit_topic="a", policies_topic="pol")
    return ReplayRequest(settings, registry=registry or build_registry(None, ALLOWED_POLICIES),
                         **fields)


def run(replay_request: ReplayRequest) -> module.ReplayReport:
    return asyncio.run(replay(replay_request, asyncio.Event()))


def test_a_range_spanning_a_policy_change_replays_byte_identical(
    topics: Topics, tmp_path: Path
) -> None:
    out = tmp_path / "prompts.jsonl"
    report = run(request(recorded=True, compare=True, out=out))
    assert [c.status for c in report.comparisons] == ["identical"] * 8
    assert report.unrecorded == 0
    published = [r.value for r in topics.partition("p", 0)]
    assert out.read_bytes().splitlines() == published
    hashes = {json.loads(line)["policy"]["hash"] for line in published}
    assert len(hashes) >= 2, "the range really spans two policies"

    # Under one policy, the events of the other are different.
    fixed = run(request(compare=True))
    assert [c.status for c in fixed.comparisons][4:] != ["identical"] * 4
    assert [c.status for c in fixed.comparisons][:4] == ["identical"] * 4


def test_the_records_may_come_from_a_file(topics: Topics, tmp_path: Path) -> None:
    recorded = RecordedPolicies("policies.jsonl")
    for record in topics.partition("pol", 0):
        recorded.add(None, record.value)
    del topics.data["pol"]  # not read
    report = run(request(recorded=True, compare=True, policies=recorded))
    assert [c.status for c in report.comparisons] == ["identical"] * 8


def test_a_hash_not_recorded_is_named_and_nothing_is_written(
    topics: Topics, tmp_path: Path
) -> None:
    tight_hash = tight(tmp_path).default.hash
    kept = [r for r in topics.partition("pol", 0) if r.key != tight_hash.encode()]
    topics.data["pol"][0] = kept
    out = tmp_path / "out" / "prompts.jsonl"
    out.parent.mkdir()
    with pytest.raises(PolicyNotRecorded) as caught:
        run(request(recorded=True, out=out))
    assert str(caught.value) == (
        f"policy {tight_hash} is not recorded in topic pol (the policy of the prompt "
        "published for in/0/4)")
    assert list(out.parent.iterdir()) == []


def test_a_tampered_record_is_refused(topics: Topics, tmp_path: Path) -> None:
    tight_hash = tight(tmp_path).default.hash
    records = topics.partition("pol", 0)
    for n, record in enumerate(records):
        if record.key == tight_hash.encode():
            altered = json.loads(record.value)
            altered["settings"]["budget"]["context_tokens"] = 3000
            records[n] = replace(record, value=json.dumps(altered).encode())
    with pytest.raises(PolicyNotRecorded, match=f"holds rules that hash to sha256:.* not the "
                       f"rules of {tight_hash}"):
        run(request(recorded=True))


def test_events_without_a_published_prompt_go_under_the_operators_policy(
    topics: Topics,
) -> None:
    topics.data["p"][0] = topics.partition("p", 0)[:6]  # the last two prompts are lost
    report = run(request(recorded=True, compare=True))
    assert report.unrecorded == 2
    statuses = [c.status for c in report.comparisons]
    assert statuses == ["identical"] * 6 + ["not published"] * 2
    # Under the default policy, as the operator's registry says, not the tight one.
    expected, _ = file_mode(GOOD[6:])
    assert [r.result[0] for r in report.replayed[6:]] == [
        expected[json.loads(line)["request_id"]] for line in GOOD[6:]]
