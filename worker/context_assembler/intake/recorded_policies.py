"""Policies recorded by hash: each policy's canonical record, and the records read back.

Outputs carry their policy's hash, not its rules. The worker publishes the record of every
policy it may assemble under (keyed by that hash) before it consumes, and the file mode can
write the same records, so a replay or an explain weeks later finds the rules that were in
force. A record is used only if its rules still hash to its key under this engine: a record
altered, or written by an engine that hashes other rules, is refused, never trusted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import orjson
from pydantic import ValidationError

from context_assembler.contract.models import EngineInfo, PolicyRecord
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.operator_files import MIB, read_operator_file
from context_assembler.engine.policy import Policy
from context_assembler.engine.version import __version__
from context_assembler.intake.codec import encode
from context_assembler.intake.policy_registry import PolicyRegistry


class PolicyNotRecorded(ContextAssemblerError, LookupError):
    """A hash that no usable record holds."""


def record_of(policy: Policy) -> PolicyRecord:
    return PolicyRecord(
        name=policy.name, hash=policy.hash, engine=EngineInfo(version=__version__),
        settings=policy.model_dump(mode="json", exclude={"name"}),
    )


def record_bytes(policy: Policy) -> bytes:
    return encode(record_of(policy))


def registry_policies(registry: PolicyRegistry) -> list[Policy]:
    """Every policy `registry` assembles under: the service policy, then each allowed one as
    requests get it (with the service's guard, so with the hash their outputs carry)."""
    service = registry.default
    return [service, *(registry.resolve(name) for name in registry.allowed_names
                       if name != service.name)]


class PinnedRegistry(PolicyRegistry):
    """One policy for every request, whatever it names: a replay under the policy an output
    records (the request was allowed that policy when it was published)."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)

    def resolve(self, name: str | None) -> Policy:
        return self.default


class RecordedPolicies:
    """Policy records by hash, as read from the policies topic or a file, in order: a later
    record of a hash replaces an earlier one and a tombstone removes it, as compaction does."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._records: dict[str, PolicyRecord | str] = {}  # hash -> record, or why unusable

    def __len__(self) -> int:
        return len(self._records)

    def add(self, key: bytes | None, value: bytes | None, line: int | None = None) -> None:
        """One record from the topic; from a file (`key` None, `line` its number) the
        record's own hash is its key, and a line that is not a record is an error."""
        if key is not None and value is None:
            self._records.pop(key.decode("utf-8", "replace"), None)
            return
        try:
            record: PolicyRecord | str = PolicyRecord.model_validate_json(value or b"")
        except ValidationError as error:
            problem = error.errors()[0]
            place = ".".join(str(p) for p in problem["loc"]) or "<root>"
            record = f"not a policy record: {place}: {problem['msg']}"
        if key is not None:
            self._records[key.decode("utf-8", "replace")] = record
        elif isinstance(record, str):
            raise PolicyNotRecorded(f"{self.where}:{line}: {record}")
        else:
            self._records[record.hash] = record

    def record(self, policy_hash: str) -> PolicyRecord:
        """The record of `policy_hash`, checked: its rules hash to it under this engine."""
        found = self._records.get(policy_hash)
        if found is None:
            raise PolicyNotRecorded(f"policy {policy_hash} is not recorded in {self.where}")
        if isinstance(found, str):
            raise PolicyNotRecorded(f"the record of policy {policy_hash} in {self.where} is "
                                    f"unusable: {found}")
        rebuilt = self._rebuild(found)
        if found.hash != policy_hash or rebuilt.hash != policy_hash:
            raise PolicyNotRecorded(
                f"the record of policy {policy_hash} in {self.where} holds rules that hash to "
                f"{rebuilt.hash} under engine {__version__} (recorded by engine "
                f"{found.engine.version} as {found.hash}): not the rules of {policy_hash}")
        return found

    def policy(self, policy_hash: str, name: str | None = None) -> Policy:
        """The recorded policy of `policy_hash`, named `name` (the hash leaves the name out:
        an output's own name for it is the one to reproduce), else as recorded."""
        rebuilt = self._rebuild(self.record(policy_hash))
        return rebuilt if name is None else rebuilt.model_copy(update={"name": name})

    def _rebuild(self, record: PolicyRecord) -> Policy:
        try:
            return Policy.model_validate({**record.settings, "name": record.name})
        except ValidationError as error:
            raise PolicyNotRecorded(
                f"the record of policy {record.hash} in {self.where} has rules this engine "
                f"({__version__}) cannot read: {error.errors()[0]['msg']}") from None


def read_records(lines: Iterable[bytes], where: str) -> RecordedPolicies:
    """Records from JSONL lines, as `assemble --policies` writes them."""
    recorded = RecordedPolicies(where)
    for number, line in enumerate(lines, start=1):
        if line.strip():
            recorded.add(None, line.strip(), number)
    return recorded


# A record is a few KB (a policy file is at most 1 MiB): room for thousands of them.
POLICY_RECORDS_BYTES: Final = 64 * MIB


def read_records_file(path: str) -> RecordedPolicies:
    """The records of a JSONL file (`assemble --policies F`), read as any operator file."""
    return read_records(read_operator_file(path, "policy records file",
                                           POLICY_RECORDS_BYTES).splitlines(), path)


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shown(value: Any) -> str:
    return orjson.dumps(value).decode()


def _as_read(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` as this engine reads them: an older engine's record may spell a rule the
    old way (`drop_title_line = true`) or lack a later knob. As given if unreadable."""
    try:
        read = Policy.model_validate(settings).model_dump(mode="json")
    except ValidationError:
        return settings
    return read if "name" in settings else {k: v for k, v in read.items() if k != "name"}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per setting that differs: "budget.context_tokens: 1500 -> 300"."""
    before, after = _flat(_as_read(old)), _flat(_as_read(new))
    return [f"{key}: {_shown(before.get(key))} -> {_shown(after.get(key))}"
            for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]


def not_defaults(record: PolicyRecord) -> list[str]:
    """The record's settings that differ from the defaults: "budget.context_tokens = 300
    (default 1500)"."""
    defaults, given = _flat(Policy().model_dump(mode="json", exclude={"name"})), _flat(
        _as_read(record.settings))
    return [f"{key} = {_shown(given.get(key))} (default {_shown(defaults.get(key))})"
            for key in sorted(defaults.keys() | given.keys())
            if defaults.get(key) != given.get(key)]
