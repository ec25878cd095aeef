"""Policies recorded by hash, on a real broker: a worker under policy A over a first batch,
restarted under policy B over a second; replay, explain and policy --diff read the records."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from context_assembler.cli.main import main
from context_assembler.engine.version import __version__
from context_assembler.intake.policy_registry import build_registry
from harness.kafka import Broker
from harness.worker import (
    ALLOWED_POLICIES,
    Topics,
    events,
    keyed,
    produce,
    read_topic,
    started_workers,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
TIGHT = 'name = "tight"\n[budget]\ncontext_tokens = 300\n'


@dataclass
class TwoPolicies:
    topics: Topics
    first: list[bytes]
    second: list[bytes]
    tight: Path
    hash_a: str
    hash_b: str
    records: dict[str, bytes]  # the policies topic: key -> value


@pytest.fixture(scope="module")
def two_policies(broker: Broker, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[TwoPolicies]:
    topics = Topics.fresh()
    folder = tmp_path_factory.mktemp("recorded")
    tight = folder / "tight.toml"
    tight.write_text(TIGHT)
    lines = events(16)
    first, second = lines[:8], lines[8:]

    async def batch(lines: list[bytes], total: int, env: dict[str, str], log: str) -> None:
        with started_workers(lambda: broker, folder) as start:
            worker = start(topics, log=log, env=env)
            await produce(broker, topics.input, keyed(lines))
            await read_topic(broker, topics.audit, until=total, timeout=90)
            assert worker.stop() == 0, worker.log_tail()

    async def run() -> TwoPolicies:
        await topics.create(broker)
        await batch(first, 8, {}, "a")
        await batch(second, 16, {"ASSEMBLER_POLICY_FILE": str(tight)}, "b")
        records = await read_topic(broker, topics.policies, until=3, settle=1)
        return TwoPolicies(
            topics, first, second, tight, build_registry(None).default.hash,
            build_registry(str(tight)).default.hash, {r.key.decode(): r.value for r in records})

    yield asyncio.run(run())


def _id(line: bytes) -> str:
    return str(json.loads(line)["request_id"])


def replay(two: TwoPolicies, broker: Broker, *args: str) -> int:
    t = two.topics
    allowed = [arg for name in ALLOWED_POLICIES for arg in ("--allow-policy", name)]
    return main(["replay", "--bootstrap-servers", broker.bootstrap_servers,
                 "--input-topic", t.input, "--prompts-topic", t.prompts,
                 "--audit-topic", t.audit, "--policies-topic", t.policies, *allowed, *args])


def test_each_policy_is_recorded_by_hash(two_policies: TwoPolicies) -> None:
    two = two_policies
    allowed = {build_registry(None, ALLOWED_POLICIES).resolve(name).hash
               for name in ALLOWED_POLICIES}
    assert set(two.records) == {two.hash_a, two.hash_b} | allowed
    for key, value in two.records.items():
        record = json.loads(value)
        assert record["hash"] == key
    assert json.loads(two.records[two.hash_b])["name"] == "tight"


def test_replay_under_the_recorded_policies_is_identical_across_the_change(
    two_policies: TwoPolicies, broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    status = replay(two_policies, broker, "--policy", "recorded", "--compare")
    captured = capsys.readouterr()
    assert status == 0, captured.out + captured.err
    assert ("replayed 16 events (0 rejected) under the recorded policies (0 without a "
            "published prompt, under the service policy): 16 identical, 0 different, "
            "0 not published") in captured.out


def test_replay_under_policy_b_reports_the_first_batch_different(
    two_policies: TwoPolicies, broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    two = two_policies
    status = replay(two, broker, "--policy", str(two.tight), "--compare")
    report = capsys.readouterr().out
    assert status == 1
    different = {line.split(" ")[0] for line in report.splitlines()
                 if line.endswith(": different")}
    # A request naming an allowed policy was under that policy in both runs.
    assert different == {_id(x) for x in two.first if not json.loads(x).get("policy")}
    assert f"policy: default {two.hash_a} -> tight {two.hash_b}" in report


def test_a_hash_not_recorded_is_named(
    two_policies: TwoPolicies, broker: Broker, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    two = two_policies
    partial = tmp_path / "policies.jsonl"
    partial.write_bytes(b"".join(v + b"\n" for k, v in two.records.items() if k != two.hash_b))
    out = tmp_path / "out.jsonl"
    assert replay(two, broker, "--policy", "recorded", "--policies", str(partial),
                  "--out", str(out)) == 2
    assert f"policy {two.hash_b} is not recorded in {partial}" in capsys.readouterr().err
    assert not out.exists()


def test_explain_prints_the_recorded_policy(
    two_policies: TwoPolicies, broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    two = two_policies
    request_id = _id(two.second[0])
    assert main(["explain", request_id, "--kafka", "--bootstrap-servers",
                 broker.bootstrap_servers, "--audit-topic", two.topics.audit,
                 "--policies-topic", two.topics.policies]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (f"recorded policy tight {two.hash_b} (engine {__version__}): settings that "
                        "differ from the defaults:")
    assert lines[2] == "  budget.context_tokens = 300 (default 1500)"
    assert lines[3].startswith(f"request {request_id} | policy tight ({two.hash_b})")


def test_policy_diff_reads_the_topic(
    two_policies: TwoPolicies, broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    two = two_policies
    assert main(["policy", "--diff", two.hash_a, two.hash_b, "--bootstrap-servers",
                 broker.bootstrap_servers, "--policies-topic", two.topics.policies]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"--- default {two.hash_a} (engine {__version__})",
        f"+++ tight {two.hash_b} (engine {__version__})",
        "budget.context_tokens: 1500 -> 300",
    ]
