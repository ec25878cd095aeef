"""The Kafka commands: worker, topics, produce, replay, redrive, explain --kafka and
policy --diff from the policies topic.

`context_assembler.kafka` (faust, aiokafka) is imported inside each command, so the file
commands never load a Kafka client.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypedDict

from context_assembler.cli.common import (
    UsageError,
    command,
    open_inputs,
    parse_audit,
    refuse_overlaps,
)
from context_assembler.cli.files import policy_diff
from context_assembler.contract.catalogue import DEFAULT_PARTITIONS
from context_assembler.diagnose.explain import UnusableInput, decision_table, printable
from context_assembler.engine import Policy
from context_assembler.filemode import read_lines
from context_assembler.intake.codec import Excerpt, RejectedInput, decode_event
from context_assembler.intake.policy_registry import (
    PolicyRegistry,
    build_registry,
    load_preset,
    preset_names,
)
from context_assembler.intake.recorded_policies import (
    PolicyNotRecorded,
    RecordedPolicies,
    not_defaults,
    read_records_file,
)
from context_assembler.settings import Settings, SettingsError

if TYPE_CHECKING:
    from context_assembler.kafka.tools.replay.replay import ReplayReport, ReplayRequest
    from context_assembler.kafka.tools.tail import Answers


@command
def cmd_worker(_: argparse.Namespace, settings: Settings) -> int:
    from context_assembler.kafka.runtime.worker import run_worker

    return run_worker(settings)


@command
def cmd_acls(args: argparse.Namespace, settings: Settings) -> int:
    """acls --principal User:NAME: what to grant, printed; nothing is sent to the broker."""
    from context_assembler.kafka.tools.acls import (
        kafka_acls_commands,
        principal_problem,
        strimzi_kafka_user,
        strimzi_problem,
        worker_acls,
    )

    problem = principal_problem(args.principal)
    if problem is None and args.format == "strimzi":
        problem = strimzi_problem(args.principal, args.strimzi_cluster)
    if problem:
        raise UsageError(problem)
    acls = worker_acls(settings)
    if args.format == "strimzi":
        print(strimzi_kafka_user(args.principal, acls, args.strimzi_cluster))
    else:
        print("\n".join(kafka_acls_commands(args.principal, acls, settings.bootstrap_servers)))
    return 0


def quiet_kafka_client(settings: Settings) -> None:
    """aiokafka logs each failed connection and each metadata retry for a missing topic;
    these commands check the broker and the topics themselves and report once. What they
    read is decompressed within max_batch_bytes."""
    from context_assembler.kafka.batches import guard

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    guard(settings.max_batch_bytes)


DEFAULT_REPLICATION_FACTOR = 1


def topic_sizes(args: argparse.Namespace) -> tuple[int, int]:
    """--partitions and --replication-factor, or their defaults."""
    return (getattr(args, "partitions", DEFAULT_PARTITIONS),
            getattr(args, "replication_factor", DEFAULT_REPLICATION_FACTOR))


@command
def cmd_topics_print(args: argparse.Namespace, settings: Settings) -> int:
    """topics [--format strimzi]: the topics `topics create` would create, printed."""
    from context_assembler.kafka.tools.topics import (
        kafka_topics_commands,
        strimzi_kafka_topics,
        worker_topics,
    )

    specs = worker_topics(settings, *topic_sizes(args))
    if args.format == "strimzi":
        print(strimzi_kafka_topics(specs, args.strimzi_cluster))
    else:
        print("\n".join(kafka_topics_commands(specs, settings.bootstrap_servers)))
    return 0


@command
def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    """topics create: exit 0 when every topic is created or exists as specified, 1 when
    one exists with other partitions, replication or configs (reported, left as it is)."""
    import asyncio

    from context_assembler.kafka.clients import KafkaClients
    from context_assembler.kafka.tools.topics import create_topics, worker_topics

    quiet_kafka_client(settings)
    specs = worker_topics(settings, *topic_sizes(args))
    reports = asyncio.run(create_topics(KafkaClients.of(settings), specs))
    for report in reports:
        print(report.render())
    return 1 if any(r.status == "differs" for r in reports) else 0


@command
def cmd_schemas_register(args: argparse.Namespace, settings: Settings) -> int:
    """schemas register: exit 0 once the contract's schemas are registered under their
    subjects, 1 when a subject refuses one as incompatible (then none is registered)."""
    import asyncio

    from context_assembler.kafka.schema_registry import (
        Incompatible,
        RegistryUnavailable,
        SchemaRegistry,
    )

    if settings.schema_registry_url is None:
        raise SettingsError("schemas register needs ASSEMBLER_SCHEMA_REGISTRY_URL")
    registry = SchemaRegistry(settings)

    async def register() -> list[tuple[str, str, int]]:
        try:
            return [(contract.subject, contract.name, schema_id)
                    for contract, schema_id in await registry.register()]
        finally:
            await registry.close()

    try:
        registered = asyncio.run(register())
    except Incompatible as error:
        print(f"context-assembler: {error}", file=sys.stderr)
        return 1
    except RegistryUnavailable as error:
        raise SettingsError(f"ASSEMBLER_SCHEMA_REGISTRY_URL: {error}") from None
    for subject, name, schema_id in registered:
        print(f"{subject}: {name} schema id {schema_id}")
    return 0


@command
def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    """produce: exit 0 once sent; with --wait, once each event has its prompt or its dead
    letter (1 if some have neither after --timeout)."""
    import asyncio

    from context_assembler.kafka.clients import KafkaClients
    from context_assembler.kafka.tools.produce import produce
    from context_assembler.kafka.tools.reader import TopicReader
    from context_assembler.kafka.tools.tail import output_ends, wait_for_answers

    quiet_kafka_client(settings)
    clients, topic = KafkaClients.of(settings), settings.input_topic

    async def send(lines: Iterable[bytes]) -> Answers | None:
        if not args.wait:
            report_sent(len(await produce(clients, topic, lines)), topic)
            return None
        async with TopicReader(clients) as reader:
            starts = await output_ends(reader, [settings.prompts_topic, settings.dlq_topic])
            sent = await produce(clients, topic, lines)
            report_sent(len(sent), topic)
            return await wait_for_answers(reader, starts, settings.prompts_topic,
                                          [(topic, p, o) for p, o in sent], args.timeout)

    skipped: list[str] = []
    with open_inputs(args.files) as sources:
        answers = asyncio.run(send(producible(sources, settings.max_message_bytes, skipped)))
    for problem in skipped:
        print(f"context-assembler: {problem}", file=sys.stderr)
    if answers is None:
        return 1 if skipped else 0
    return 1 if report_answers(answers, settings, args.timeout) or skipped else 0


def report_answers(answers: Answers, settings: Settings, timeout: float) -> bool:
    """Print what answered the events sent; true if some have no answer yet."""
    for line in answers.dead_letters:
        print(f"dead letter: {line}", file=sys.stderr)
    answered = answers.prompts + len(answers.dead_letters)
    print(f"answered {answered} events: {answers.prompts} prompts on {settings.prompts_topic}, "
          f"{len(answers.dead_letters)} dead letters on {settings.dlq_topic}", file=sys.stderr)
    if answers.waiting:
        print(f"context-assembler: {len(answers.waiting)} events not answered within "
              f"{timeout:g} s; is a worker running on {settings.bootstrap_servers} "
              "(context-assembler worker)?", file=sys.stderr)
    return bool(answers.waiting)


def producible(
    sources: Iterable[tuple[str, BinaryIO]], max_bytes: int, skipped: list[str],
) -> Iterator[bytes]:
    """The non-blank lines of `sources`, none held whole past `max_bytes`: a longer line could
    not be a record of the topic, so it is left out and named in `skipped`."""
    for name, stream in sources:
        for number, line in read_lines(stream, max_bytes):
            if isinstance(line, Excerpt):
                skipped.append(f"{name}:{number}: not sent, the line is {line.length} bytes, "
                               f"over ASSEMBLER_MAX_MESSAGE_BYTES (--max-message-bytes) = "
                               f"{max_bytes}")
            else:
                yield line


def report_sent(count: int, topic: str) -> None:
    print(f"sent {count} events to {topic}", file=sys.stderr)


@command
def cmd_tail(args: argparse.Namespace, settings: Settings) -> int:
    """tail prompts|audit|dlq: the last records of an output topic, one line each; with
    --follow, new ones as they come until Ctrl-C."""
    import asyncio

    from context_assembler.kafka.clients import KafkaClients
    from context_assembler.kafka.tools.reader import TopicReader
    from context_assembler.kafka.tools.tail import tail

    if args.lines < 0:
        raise UsageError("-n takes a count of records, 0 or more")
    quiet_kafka_client(settings)
    topic = args.topic or {"prompts": settings.prompts_topic, "audit": settings.audit_topic,
                           "dlq": settings.dlq_topic}[args.output]

    def write(line: str) -> None:
        print(line, flush=True)

    async def read() -> None:
        async with TopicReader(KafkaClients.of(settings)) as reader:
            await tail(reader, args.output, topic, args.lines, args.follow, write)

    asyncio.run(read())
    return 0


class TopicRange(TypedDict):
    """The reader's range arguments (`TopicReader.spans`), as replay and redrive take them."""

    starts: list[tuple[int, int]]
    from_ms: int | None
    ends: list[tuple[int, int]]
    to_ms: int | None


def topic_range(args: argparse.Namespace) -> TopicRange:
    """--from, --from-time and --to (`common.add_range`) parsed."""
    from context_assembler.kafka.tools.reader import is_position, parse_position, parse_time

    if args.start and args.from_time:
        raise UsageError("give --from or --from-time, not both")
    return TopicRange(
        starts=[parse_position(p) for p in args.start],
        from_ms=parse_time(args.from_time) if args.from_time else None,
        ends=[parse_position(p) for p in args.to if is_position(p)],
        to_ms=next((parse_time(p) for p in args.to if not is_position(p)), None),
    )


@command
def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio
    import signal

    from context_assembler.kafka.tools.replay.replay import replay

    request = _replay_request(args, settings)

    async def run() -> ReplayReport:
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):  # stop reading; keep what was replayed
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        return await replay(request, stop)

    return _replay_summary(asyncio.run(run()), request, args.verbose)


def _replay_request(args: argparse.Namespace, settings: Settings) -> ReplayRequest:
    """What to replay, checked before connecting. replay's --policy is its own option, not
    the policy_file setting's flag: it may say `recorded`, and then the setting is the
    policy of the events without a published prompt."""
    from context_assembler.kafka.tools.replay.replay import ReplayRequest

    span = topic_range(args)
    refuse_overlaps([], {"--out": args.out, "--audit": args.audit, "--errors": args.errors})
    recorded = args.replay_policy == "recorded"
    if args.policies and not recorded:
        raise UsageError("--policies goes with --policy recorded")
    quiet_kafka_client(settings)
    return ReplayRequest(
        settings,
        registry=build_registry(settings.policy_file if recorded or args.replay_policy is None
                                else args.replay_policy, settings.allowed_policies),
        **span,
        count=args.count,
        out=Path(args.out) if args.out else None,
        audit_out=Path(args.audit) if args.audit else None,
        errors_out=Path(args.errors) if args.errors else None,
        to_topic=args.to_topic,
        to_audit_topic=args.to_audit_topic,
        compare=args.compare,
        recorded=recorded,
        policies=read_records_file(args.policies) if args.policies else None,
    )


def _replay_summary(report: ReplayReport, request: ReplayRequest, verbose: bool) -> int:
    """Print the comparisons (the identical ones only if `verbose`) and one summary line;
    exit 130 if interrupted, 1 if a comparison was asked for and something differs."""
    rejected = sum(isinstance(r.result, str) for r in report.replayed)
    for comparison in report.comparisons:
        if comparison.status != "identical" or verbose:
            print(comparison.render())
    counts = {s: sum(c.status == s for c in report.comparisons)
              for s in ("identical", "different", "not published")}
    summary = f"replayed {len(report.replayed)} events ({rejected} rejected)"
    if request.recorded:
        summary += (f" under the recorded policies ({report.unrecorded} without a "
                    "published prompt, under the service policy)")
    if request.compare:
        summary += ": " + ", ".join(f"{n} {s}" for s, n in counts.items())
    if report.interrupted:
        summary += " (interrupted: the outputs hold the events replayed so far)"
    print(summary)
    if report.interrupted:
        return 130
    return 1 if request.compare and counts["identical"] != len(report.comparisons) else 0


def recorded_policies(args: argparse.Namespace, settings: Settings) -> RecordedPolicies:
    """The policy records of --policies F, else of the policies topic."""
    import asyncio

    from context_assembler.kafka.clients import KafkaClients
    from context_assembler.kafka.tools.policies_topic import fetch_policies

    if args.policies:
        return read_records_file(args.policies)
    return asyncio.run(fetch_policies(KafkaClients.of(settings), settings.policies_topic))


@command
def cmd_policy_diff(args: argparse.Namespace, settings: Settings) -> int:
    """policy --diff HASH_A HASH_B, from the policies topic."""

    quiet_kafka_client(settings)
    return policy_diff(recorded_policies(args, settings), args.diff)


@command
def cmd_redrive(args: argparse.Namespace, settings: Settings) -> int:
    """redrive: dead letters back to the input topic, grouped by reason; a dry run unless
    --yes."""
    import asyncio

    from context_assembler.kafka.tools.reader import TopicReader
    from context_assembler.kafka.tools.redrive import RedriveReport, RedriveRequest, redrive
    from context_assembler.kafka.tools.tail import output_ends, wait_for_answers

    span = topic_range(args)
    if args.yes and args.dry_run:
        raise UsageError("give --yes or --dry-run, not both")
    quiet_kafka_client(settings)
    request = RedriveRequest(settings, **span, count=args.count,
                             max_redrives=args.max_redrives, send=args.yes)
    if args.wait and not args.yes:
        raise UsageError("--wait waits for what --yes sends: give both")

    async def run() -> tuple[RedriveReport, Answers | None]:
        if not args.wait:
            return await redrive(request), None
        async with TopicReader(request.clients) as reader:
            starts = await output_ends(reader, [settings.prompts_topic, settings.dlq_topic])
            report = await redrive(request)
            resent = [(settings.input_topic, p, o) for p, o in report.resent]
            return report, await wait_for_answers(reader, starts, settings.prompts_topic,
                                                  resent, args.timeout)

    report, answers = asyncio.run(run())
    for line in report.render(settings.input_topic, request.max_redrives):
        print(printable(line))
    sys.stdout.flush()  # before what answered them, on stderr
    return 1 if answers is not None and report_answers(answers, settings, args.timeout) else 0


def recorded_policy(registry: PolicyRegistry, name: str) -> Policy:
    """The policy an audit names: allowed here, else the preset of that name, else the
    service policy. The operator runs explain, so any preset may be shown."""
    if name in registry.allowed_names:
        return registry.resolve(name)
    return load_preset(name) if name in preset_names() else registry.default


@command
def cmd_explain(args: argparse.Namespace, settings: Settings) -> int:
    """explain REQUEST_ID --kafka: its latest audit on the audit topic, and its input."""
    import asyncio

    from context_assembler.kafka.clients import KafkaClients
    from context_assembler.kafka.tools.reader import RangeError, parse_time
    from context_assembler.kafka.tools.replay.replay import find_recorded

    if args.request_id is None:
        raise UsageError("explain --kafka needs a REQUEST_ID")
    quiet_kafka_client(settings)
    registry = build_registry(settings.policy_file, settings.allowed_policies)
    raw, audit_bytes, origin = asyncio.run(find_recorded(  # or NotRecorded
        KafkaClients.of(settings),
        settings.audit_topic,
        args.request_id,
        parse_time(args.from_time) if args.from_time else None,
    ))
    try:
        event = decode_event(raw, settings.limits)
    except RejectedInput as error:
        raise UnusableInput(f"the input {origin} cannot be decoded: {error.reason}: "
                            f"{error.message}") from None
    audit = parse_audit(audit_bytes, f"the audit of {args.request_id!r}")
    policy = recorded_policy(registry, audit.policy.name)
    print(printable(f"input {origin}"))
    try:
        recorded = recorded_policies(args, settings)
        record = recorded.record(audit.policy.hash)
    except (PolicyNotRecorded, RangeError) as error:
        print(printable(f"recorded policy {audit.policy.name} {audit.policy.hash}: not found "
                        f"({error})"))
    else:
        policy = recorded.policy(record.hash, audit.policy.name)
        changed = not_defaults(record)
        print(printable(f"recorded policy {audit.policy.name} {record.hash} (engine "
                        f"{record.engine.version}): "
                        + ("settings that differ from the defaults:" if changed
                           else "the defaults")))
        for line in changed:
            print(printable(f"  {line}"))
    if policy.hash != audit.policy.hash:
        print(printable(f"(recorded under {audit.policy.hash}; tokens of dropped chunks are "
                        f"counted under {policy.name} {policy.hash})"))
    print(decision_table(event, audit, policy))
    return 0
