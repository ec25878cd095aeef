"""The file commands, no broker: assemble, explain, sweep and evaluate over JSONL files,
policy, and the citation check of answers against their prompts."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from context_assembler import filemode
from context_assembler.cli.common import (
    NotFound,
    UsageError,
    command,
    file_errors,
    note,
    open_inputs,
    open_output,
    parse_audit,
    refuse_overlaps,
)
from context_assembler.collector import collect_less
from context_assembler.contract.models import (
    AssembledPrompt,
    AssemblyAudit,
    CitationCheck,
    RejectReason,
    RetrievalResult,
)
from context_assembler.diagnose import evaluate
from context_assembler.diagnose.explain import (
    SEED_BUDGETS,
    UnusableInput,
    decision_table,
    printable,
    sweep,
    sweep_chart,
    sweep_table,
)
from context_assembler.engine import Policy, assemble
from context_assembler.intake import citations
from context_assembler.intake.codec import Excerpt, Limits, RejectedInput, decode_event, encode
from context_assembler.intake.handle import resolve_policy
from context_assembler.intake.policy_registry import PolicyRegistry, build_registry, load_policy
from context_assembler.intake.recorded_policies import (
    RecordedPolicies,
    differences,
    read_records_file,
)
from context_assembler.settings import Settings


@command
def cmd_assemble(args: argparse.Namespace, settings: Settings) -> int:
    outputs = {"--out": args.out or "-", "--audit": args.audit, "--errors": args.errors or "-"}
    if args.policies == "-":
        raise UsageError("--policies needs a file name")
    refuse_overlaps(args.files or ["-"], {**outputs, "--policies": args.policies})
    registry = build_registry(settings.policy_file, settings.allowed_policies)
    with (  # every output file is renamed into place only when the whole run succeeds
        open_inputs(args.files) as sources,
        open_output("--out", outputs["--out"]) as prompts,
        open_output("--audit", outputs["--audit"]) as audits,
        open_output("--errors", outputs["--errors"]) as errors,
        open_output("--policies", args.policies) as records,
    ):
        assert prompts is not None and errors is not None
        if records is not None:
            filemode.write_policies(registry, records)
        collect_less()  # started: what start-up made is never scanned again
        totals = filemode.run(
            sources, registry, settings.limits, prompts=prompts, audits=audits, errors=errors
        )
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(totals.reasons.items()))
    print(
        f"assembled {totals.assembled}, rejected {totals.rejected}"
        + (f" ({reasons})" if reasons else ""),
        file=sys.stderr,
    )
    return 1 if totals.rejected else 0


def _events(path: str, limits: Limits) -> Iterator[tuple[str, bytes | Excerpt]]:
    """(origin, line) for each event of --events."""
    with open_inputs([path]) as sources:
        for name, stream in sources:
            for number, line in filemode.read_lines(stream, limits.max_event_bytes):
                yield f"{name}:{number}", line


def _selected_events(
    args: argparse.Namespace, registry: PolicyRegistry, limits: Limits
) -> Iterator[tuple[RetrievalResult, Policy]]:
    """The events asked for, each with its policy; a line that cannot be assembled is
    named on stderr and skipped, as the file mode would reject it."""
    found = skipped = False
    for origin, raw in _events(args.events, limits):
        try:
            event = decode_event(raw, limits)
            if args.request_id not in (None, event.request_id):
                continue
            policy = resolve_policy(registry, event)
        except RejectedInput as error:
            note(f"{origin}: skipped: {error.reason}: {error.message}")
            skipped = skipped or error.request_id == args.request_id
            continue
        found = True
        yield event, policy
    if args.request_id is not None and not found:
        where = "was skipped" if skipped else "is not"
        raise NotFound(f"request {args.request_id!r} {where} in {args.events}")


def _recorded_audits(path: str, max_bytes: int) -> dict[str, AssemblyAudit]:
    """request_id -> the last audit recorded for it in an audit JSONL file. The file is
    untrusted: a line over `max_bytes` is refused by its number, never held whole."""
    audits: dict[str, AssemblyAudit] = {}
    with file_errors(path), open(path, "rb") as stream:
        for number, line in filemode.read_lines(stream, max_bytes):
            if isinstance(line, Excerpt):
                raise UnusableInput(f"{path}:{number}: the line is {line.length} bytes, over "
                                    f"--max-event-bytes={max_bytes}")
            audit = parse_audit(line, f"{path}:{number}")
            audits[audit.request_id] = audit
    return audits


@command
def cmd_explain(args: argparse.Namespace, settings: Settings) -> int:
    """The decisions for the events of --events: recorded in --audit, or assembled now."""
    registry = build_registry(settings.policy_file, settings.allowed_policies)
    recorded = _recorded_audits(args.audit, settings.limits.max_event_bytes) if args.audit else {}
    for event, policy in _selected_events(args, registry, settings.limits):
        audit = recorded.get(event.request_id) or assemble(event, policy).audit
        if args.audit and event.request_id not in recorded:
            note(f"(no recorded audit for {event.request_id}: assembled now)")
        print(decision_table(event, audit, policy))
        print()
    return 0


def parse_budgets(text: str) -> list[int]:
    """"100:1000:50,1500": every 50 from 100 to 1000, then 1500."""
    found: list[int] = []
    try:
        for part in text.split(","):
            if ":" in part:
                start, stop, step = (int(x) for x in part.split(":"))
                found.extend(range(start, stop + 1, step))
            else:
                found.append(int(part))
    except ValueError:
        found = []
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r}: expected budgets such as 100:1000:50,1500")
    return found


_NOT_IN_FILE_NAMES = re.compile(r"[^A-Za-z0-9._-]")


@command
def cmd_sweep(args: argparse.Namespace, settings: Settings) -> int:
    registry = build_registry(settings.policy_file, settings.allowed_policies)
    for event, policy in _selected_events(args, registry, settings.limits):
        points = sweep(event, policy, args.budgets or SEED_BUDGETS)
        print(sweep_table(event, points, policy))
        if args.png:
            png = Path(args.png)
            if args.request_id is None:  # one chart per request, named after it (untrusted)
                name = _NOT_IN_FILE_NAMES.sub("_", event.request_id)
                png = png.with_name(f"{png.stem}-{name}{png.suffix}")
            with file_errors(str(png)):
                sweep_chart(event, points, policy, str(png))
            print(f"chart: {png}")
        print()
    return 0


@command
def cmd_evaluate(args: argparse.Namespace, settings: Settings) -> int:
    policies = [load_policy(spec) for spec in args.policies]
    with file_errors(args.file):
        records = evaluate.read_labelled(args.file)
    scores = evaluate.evaluate(records, policies, args.budgets)
    print(f"{len(records)} questions")
    print(evaluate.table(scores))
    if args.chart:
        with file_errors(args.chart):
            evaluate.chart(scores, args.chart)
        print(f"chart: {args.chart}")
    return 0


def full_hash(text: str) -> str:
    """A policy hash as outputs carry it; the "sha256:" may be left out."""
    return text if text.startswith("sha256:") else f"sha256:{text}"


def policy_diff(recorded: RecordedPolicies, hashes: list[str]) -> int:
    """What changed from the first recorded policy to the second: exit 1 if anything did."""
    old, new = (recorded.record(full_hash(h)) for h in hashes)  # or PolicyNotRecorded
    print(printable(f"--- {old.name} {old.hash} (engine {old.engine.version})"))
    print(printable(f"+++ {new.name} {new.hash} (engine {new.engine.version})"))
    changed = differences(old.settings, new.settings)
    for line in changed or ["no setting differs"]:
        print(printable(line))
    return 1 if changed else 0


@command
def cmd_policy(args: argparse.Namespace, settings: Settings) -> int:
    if args.diff:
        return policy_diff(read_records_file(args.policies), args.diff)
    policy = load_policy(settings.policy_file)
    print(f"# {policy.name} {policy.hash}")
    print(policy.model_dump_json(indent=2))
    return 0


def _prompts(path: str, limits: Limits, errors: BinaryIO) -> tuple[dict[str, AssembledPrompt], int]:
    """request_id -> its prompt (the last line for it wins), and how many lines were not
    prompts (each written to `errors`)."""
    prompts: dict[str, AssembledPrompt] = {}
    rejected = 0
    with file_errors(path), open(path, "rb") as stream:
        for number, line in filemode.read_lines(stream, limits.max_event_bytes):
            try:
                if isinstance(line, Excerpt):
                    raise RejectedInput(RejectReason.LIMITS, f"the prompt is {line.length} "
                                        f"bytes, over max_event_bytes={limits.max_event_bytes}")
                prompt = citations.decode_prompt(line, limits)
            except RejectedInput as error:
                errors.write(encode(error.record(f"{path}:{number}", line)) + b"\n")
                rejected += 1
                continue
            prompts[prompt.request_id] = prompt
    return prompts, rejected


@command
def cmd_citations(args: argparse.Namespace, settings: Settings) -> int:
    """One CitationCheck line per answer of --answers, against the prompt of its
    request_id in --prompts; an answer that cannot be checked gets an error record."""
    limits = settings.limits
    refuse_overlaps([args.prompts, args.answers], {"--out": args.out or "-",
                                                   "--errors": args.errors or "-"})
    checked = 0
    with (
        open_output("--out", args.out or "-") as out,
        open_output("--errors", args.errors or "-") as errors,
    ):
        assert out is not None and errors is not None
        prompts, rejected = _prompts(args.prompts, limits, errors)
        with open_inputs([args.answers]) as sources:
            for name, stream in sources:
                for number, line in filemode.read_lines(stream, limits.max_event_bytes):
                    try:
                        result = _check(line, prompts, limits)
                    except RejectedInput as error:
                        errors.write(encode(error.record(f"{name}:{number}", line)) + b"\n")
                        rejected += 1
                        continue
                    out.write(encode(result) + b"\n")
                    checked += 1
    print(f"checked {checked}, rejected {rejected}", file=sys.stderr)
    return 1 if rejected else 0


def _check(line: bytes | Excerpt, prompts: dict[str, AssembledPrompt],
           limits: Limits) -> CitationCheck:
    if isinstance(line, Excerpt):
        raise RejectedInput(RejectReason.LIMITS, f"the answer record is {line.length} bytes, "
                            f"over max_event_bytes={limits.max_event_bytes}")
    record = citations.decode_answer(line, limits)
    prompt = prompts.get(record.request_id)
    if prompt is None:
        raise RejectedInput(RejectReason.SCHEMA, "no prompt in --prompts has this "
                            "request_id", record.request_id)
    return citations.check(record.answer, prompt, limits)
