"""`context-assembler`: assemble, explain and sweep over JSONL files; the worker commands.

Exit status: 0 when every line was assembled, 1 when some line was rejected, 2 for a
usage, policy or setup error, 70 for a bug, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from schemas.models import AssemblyAudit, RetrievalResult
from worker import __version__, filemode
from worker.diagnose.explain import (
    SEED_BUDGETS,
    UnusableInput,
    decision_table,
    printable,
    sweep,
    sweep_chart,
    sweep_table,
)
from worker.engine import Policy, assemble
from worker.engine.errors import ContextAssemblerError
from worker.intake.codec import Excerpt, Limits, RejectedInput, decode_event
from worker.intake.policies import (
    PolicyRegistry,
    build_registry,
    load_policy,
    load_preset,
    preset_names,
)
from worker.kafka.replay.reader import RangeError, is_position, parse_position, parse_time

# The stream "-" means for each output option.
STDOUT, STDERR = 1, 2
_STREAM_OF = {"--out": STDOUT, "--audit": STDOUT, "--errors": STDERR}


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        max_event_bytes=args.max_event_bytes,
        max_chunks=args.max_chunks,
        max_chunk_chars=args.max_chunk_chars,
    )


@contextlib.contextmanager
def _inputs(paths: Sequence[str]) -> Iterator[list[tuple[str, BinaryIO]]]:
    with contextlib.ExitStack() as stack:
        sources: list[tuple[str, BinaryIO]] = []
        for path in paths or ["-"]:
            if path == "-":
                sources.append(("<stdin>", sys.stdin.buffer))
            else:
                sources.append((path, stack.enter_context(open(path, "rb"))))
        yield sources


@contextlib.contextmanager
def _output(option: str, path: str | None) -> Iterator[BinaryIO | None]:
    """None: not written; "-": stdout or stderr, as it goes; a path: written whole at the end."""
    if path is None:
        yield None
    elif path == "-":
        yield sys.stdout.buffer if _STREAM_OF[option] == STDOUT else sys.stderr.buffer
    else:
        with filemode.output_file(path) as stream:
            yield stream


def _refuse_overlaps(inputs: Sequence[str], outputs: dict[str, str | None]) -> None:
    """Before anything is read or written: no output may be an input or another output."""
    filemode.refuse_overlaps(
        [0 if path == "-" else path for path in inputs],
        {option: _STREAM_OF[option] if path == "-" else path
         for option, path in outputs.items() if path is not None},
    )


def cmd_assemble(args: argparse.Namespace) -> int:
    outputs = {"--out": args.out or "-", "--audit": args.audit, "--errors": args.errors or "-"}
    _refuse_overlaps(args.files or ["-"], outputs)
    registry = build_registry(args.policy, args.allow_policy)
    with (
        _inputs(args.files) as sources,
        _output("--out", outputs["--out"]) as prompts,
        _output("--audit", outputs["--audit"]) as audits,
        _output("--errors", outputs["--errors"]) as errors,
    ):
        assert prompts is not None and errors is not None
        totals = filemode.run(
            sources, registry, _limits(args), prompts=prompts, audits=audits, errors=errors
        )
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(totals.reasons.items()))
    print(
        f"assembled {totals.assembled}, rejected {totals.rejected}"
        + (f" ({reasons})" if reasons else ""),
        file=sys.stderr,
    )
    return 1 if totals.rejected else 0


def _events(args: argparse.Namespace) -> Iterator[tuple[str, bytes | Excerpt]]:
    with _inputs([args.events]) as sources:
        for name, stream in sources:
            for number, line in filemode.read_lines(stream, args.max_event_bytes):
                yield f"{name}:{number}", line


def _selected_events(
    args: argparse.Namespace, registry: PolicyRegistry
) -> Iterator[tuple[RetrievalResult, Policy]]:
    """The events asked for, each with its policy; a line that cannot be assembled is
    named on stderr and skipped, as the file mode would reject it."""
    found = skipped = False
    for origin, raw in _events(args):
        try:
            event = decode_event(raw, _limits(args))
            if args.request_id not in (None, event.request_id):
                continue
            policy = registry.resolve(event.policy, event.request_id)
        except RejectedInput as error:
            print(printable(f"{origin}: skipped: {error.reason}: {error.message}"),
                  file=sys.stderr)
            skipped = skipped or error.request_id == args.request_id
            continue
        found = True
        yield event, policy
    if args.request_id is not None and not found:
        where = "was skipped" if skipped else "is not"
        raise LookupError(f"request {args.request_id!r} {where} in {args.events}")


def _audit(data: bytes | str, where: str) -> AssemblyAudit:
    try:
        return AssemblyAudit.model_validate_json(data)
    except ValidationError as error:
        problem = error.errors()[0]
        place = ".".join(str(p) for p in problem["loc"]) or "<root>"
        raise UnusableInput(f"{where}: not an AssemblyAudit: {place}: {problem['msg']}") from None


def _recorded_audits(path: str) -> dict[str, AssemblyAudit]:
    """request_id -> the last audit recorded for it in an audit JSONL file."""
    audits: dict[str, AssemblyAudit] = {}
    with open(path, "rb") as stream:
        for number, line in enumerate(stream, start=1):
            if line.strip():
                audit = _audit(line, f"{path}:{number}")
                audits[audit.request_id] = audit
    return audits


def cmd_explain(args: argparse.Namespace) -> int:
    if args.kafka:
        return _explain_from_kafka(args)
    registry = build_registry(args.policy, args.allow_policy)
    recorded = _recorded_audits(args.audit) if args.audit else {}
    for event, policy in _selected_events(args, registry):
        audit = recorded.get(event.request_id) or assemble(event, policy).audit
        if args.audit and event.request_id not in recorded:
            print(printable(f"(no recorded audit for {event.request_id}: assembled now)"),
                  file=sys.stderr)
        print(decision_table(event, audit, policy))
        print()
    return 0


def _recorded_policy(registry: PolicyRegistry, name: str) -> Policy:
    """The policy an audit names: allowed here, else the preset of that name, else the
    service policy. The operator runs explain, so any preset may be shown."""
    if name in registry.allowed_names:
        return registry.resolve(name)
    return load_preset(name) if name in preset_names() else registry.default


def _explain_from_kafka(args: argparse.Namespace) -> int:
    import asyncio

    from worker.kafka.replay.replay import find_recorded
    from worker.kafka.settings import load_settings

    if args.request_id is None:
        raise LookupError("explain --kafka needs a REQUEST_ID")
    settings = load_settings()
    registry = build_registry(args.policy or settings.policy_file,
                              args.allow_policy or settings.allowed_policies)
    raw, audit_bytes, origin = asyncio.run(find_recorded(
        args.bootstrap_servers or settings.bootstrap_servers,
        args.audit_topic or settings.audit_topic,
        args.request_id,
        parse_time(args.from_time) if args.from_time else None,
    ))
    try:
        event = decode_event(raw, _limits(args))
    except RejectedInput as error:
        raise UnusableInput(f"the input {origin} cannot be decoded: {error.reason}: "
                            f"{error.message}") from None
    audit = _audit(audit_bytes, f"the audit of {args.request_id!r}")
    policy = _recorded_policy(registry, audit.policy.name)
    print(printable(f"input {origin}"))
    if policy.hash != audit.policy.hash:
        print(printable(f"(recorded under {audit.policy.hash}; tokens of dropped chunks are "
                        f"counted under {policy.name} {policy.hash})"))
    print(decision_table(event, audit, policy))
    return 0


def _budgets(text: str) -> list[int]:
    """"100:1000:50,1500": every 50 from 100 to 1000, then 1500."""
    budgets: list[int] = []
    try:
        for part in text.split(","):
            if ":" in part:
                start, stop, step = (int(x) for x in part.split(":"))
                budgets.extend(range(start, stop + 1, step))
            else:
                budgets.append(int(part))
    except ValueError:
        budgets = []
    if not budgets:
        raise argparse.ArgumentTypeError(f"{text!r}: expected budgets such as 100:1000:50,1500")
    return budgets


_NOT_IN_FILE_NAMES = re.compile(r"[^A-Za-z0-9._-]")


def cmd_sweep(args: argparse.Namespace) -> int:
    registry = build_registry(args.policy, args.allow_policy)
    for event, policy in _selected_events(args, registry):
        points = sweep(event, policy, args.budgets or SEED_BUDGETS)
        print(sweep_table(event, points))
        if args.png:
            png = Path(args.png)
            if args.request_id is None:  # one chart per request, named after it (untrusted)
                name = _NOT_IN_FILE_NAMES.sub("_", event.request_id)
                png = png.with_name(f"{png.stem}-{name}{png.suffix}")
            sweep_chart(event, points, str(png))
            print(f"chart: {png}")
        print()
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    print(f"# {policy.name} {policy.hash}")
    print(policy.model_dump_json(indent=2))
    return 0


def cmd_worker(_: argparse.Namespace) -> int:
    from worker.kafka.run import run_worker
    from worker.kafka.settings import load_settings

    return run_worker(load_settings())


def cmd_produce(args: argparse.Namespace) -> int:
    import asyncio

    from worker.kafka.produce import produce
    from worker.kafka.settings import load_settings

    settings = load_settings()
    servers = args.bootstrap_servers or settings.bootstrap_servers
    topic = args.topic or settings.input_topic
    with _inputs(args.files) as sources:
        lines = (line for _, stream in sources for line in stream)
        sent = asyncio.run(produce(servers, topic, lines))
    print(f"sent {sent} events to {topic}", file=sys.stderr)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from worker.kafka.replay.replay import ReplayRequest, replay
    from worker.kafka.settings import load_settings

    if args.start and args.from_time:
        raise RangeError("give --from or --from-time, not both")
    _refuse_overlaps([], {"--out": args.out, "--audit": args.audit, "--errors": args.errors})
    settings = load_settings()
    request = ReplayRequest(
        bootstrap_servers=args.bootstrap_servers or settings.bootstrap_servers,
        input_topic=args.input_topic or settings.input_topic,
        prompts_topic=args.prompts_topic or settings.prompts_topic,
        audit_topic=args.audit_topic or settings.audit_topic,
        registry=build_registry(args.policy or settings.policy_file,
                                args.allow_policy or settings.allowed_policies),
        limits=_limits(args),
        starts=[parse_position(p) for p in args.start],
        from_ms=parse_time(args.from_time) if args.from_time else None,
        ends=[parse_position(p) for p in args.to if is_position(p)],
        to_ms=next((parse_time(p) for p in args.to if not is_position(p)), None),
        count=args.count,
        out=Path(args.out) if args.out else None,
        audit_out=Path(args.audit) if args.audit else None,
        errors_out=Path(args.errors) if args.errors else None,
        to_topic=args.to_topic,
        to_audit_topic=args.to_audit_topic,
        compare=args.compare,
    )

    async def run() -> int:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        report = await replay(request, stop)
        rejected = sum(isinstance(r.result, str) for r in report.replayed)
        for comparison in report.comparisons:
            if comparison.status != "identical" or args.verbose:
                print(comparison.render())
        counts = {s: sum(c.status == s for c in report.comparisons)
                  for s in ("identical", "different", "not published")}
        summary = f"replayed {len(report.replayed)} events ({rejected} rejected)"
        if request.compare:
            summary += ": " + ", ".join(f"{n} {s}" for s, n in counts.items())
        if report.interrupted:
            summary += " (interrupted: the outputs hold the events replayed so far)"
        print(summary)
        if report.interrupted:
            return 130
        return 1 if request.compare and counts["identical"] != len(report.comparisons) else 0

    return asyncio.run(run())


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive whole number")
    return value


def _add_limits(parser: argparse.ArgumentParser) -> None:
    defaults = Limits()
    parser.add_argument("--max-event-bytes", type=_positive, default=defaults.max_event_bytes)
    parser.add_argument("--max-chunks", type=_positive, default=defaults.max_chunks)
    parser.add_argument("--max-chunk-chars", type=_positive, default=defaults.max_chunk_chars)


def _add_policies(
    parser: argparse.ArgumentParser, policy_help: str, allow_default: str = "default: none"
) -> None:
    parser.add_argument("--policy", help=policy_help)
    parser.add_argument(
        "--allow-policy", action="append", default=[], metavar="NAME",
        help=f"a policy requests may name: preset or TOML file (repeatable); {allow_default}",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="context-assembler", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an unexpected error")
    commands = parser.add_subparsers(dest="command", required=True)
    policy_help = f"TOML policy file or preset ({', '.join(preset_names())}); default: default"

    run = commands.add_parser(
        "assemble", help="RetrievalResult JSONL in, AssembledPrompt JSONL out"
    )
    run.add_argument("files", nargs="*", help="JSONL files, or - for stdin (the default)")
    _add_policies(run, policy_help)
    run.add_argument("--out", help="AssembledPrompt JSONL (default: stdout)")
    run.add_argument("--audit", help="AssemblyAudit JSONL, - for stdout (default: not written)")
    run.add_argument("--errors", help="error records JSONL (default: stderr)")
    _add_limits(run)
    run.set_defaults(handler=cmd_assemble)

    explain = commands.add_parser("explain", help="one table per request: kept, or dropped and why")
    explain.add_argument("request_id", nargs="?", help="only this request (default: all)")
    explain.add_argument("--events", default="-", help="RetrievalResult JSONL (default: stdin)")
    explain.add_argument("--audit", help="AssemblyAudit JSONL: show the recorded decisions")
    explain.add_argument("--kafka", action="store_true",
                         help="find the audit on the audit topic and its input on the input topic")
    explain.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    explain.add_argument("--audit-topic", help="default: ASSEMBLER_AUDIT_TOPIC")
    explain.add_argument("--from-time", help="search audits from this ISO-8601 time on")
    _add_policies(explain, policy_help + " (with --kafka: ASSEMBLER_POLICY_FILE)",
                  "default: none (with --kafka: ASSEMBLER_ALLOWED_POLICIES)")
    _add_limits(explain)
    explain.set_defaults(handler=cmd_explain)

    sweeper = commands.add_parser("sweep", help="what fits at each passage budget")
    sweeper.add_argument("request_id", nargs="?", help="only this request (default: all)")
    sweeper.add_argument("--events", default="-", help="RetrievalResult JSONL (default: stdin)")
    _add_policies(sweeper, policy_help)
    sweeper.add_argument("--budgets", type=_budgets,
                         help="e.g. 100:1000:50,1500 (the default, seed 000's slider)")
    sweeper.add_argument("--png", help="also draw the sweep as a PNG chart")
    _add_limits(sweeper)
    sweeper.set_defaults(handler=cmd_sweep)

    work = commands.add_parser("worker", help="the Kafka worker (settings: ASSEMBLER_* variables)")
    work.set_defaults(handler=cmd_worker)

    send = commands.add_parser("produce", help="send JSONL events to the input topic")
    send.add_argument("files", nargs="*", help="JSONL files, or - for stdin (the default)")
    send.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    send.add_argument("--topic", help="default: ASSEMBLER_INPUT_TOPIC")
    send.set_defaults(handler=cmd_produce)

    rerun = commands.add_parser(
        "replay", help="re-assemble input events from the topic, optionally compare")
    rerun.add_argument("--from", dest="start", action="append", default=[], metavar="P:OFFSET",
                       help="start of one partition (repeatable)")
    rerun.add_argument("--from-time", help="start of every partition at this ISO-8601 time")
    rerun.add_argument("--to", action="append", default=[], metavar="P:OFFSET|TIME",
                       help="end (exclusive): an offset of a partition, or an ISO-8601 time")
    rerun.add_argument("--count", type=int, help="stop after this many events")
    _add_policies(rerun, policy_help + " (default: ASSEMBLER_POLICY_FILE)",
                  "default: ASSEMBLER_ALLOWED_POLICIES")
    rerun.add_argument("--out", help="AssembledPrompt JSONL")
    rerun.add_argument("--audit", help="AssemblyAudit JSONL")
    rerun.add_argument("--errors", help="error records JSONL for rejected events")
    rerun.add_argument("--to-topic", help="publish prompts here (one transaction)")
    rerun.add_argument("--to-audit-topic", help="publish audits here (default: TO_TOPIC.audit)")
    rerun.add_argument("--compare", action="store_true",
                       help="compare with what the worker published; exit 0 only if identical")
    rerun.add_argument("--verbose", action="store_true", help="list identical requests too")
    rerun.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    rerun.add_argument("--input-topic", help="default: ASSEMBLER_INPUT_TOPIC")
    rerun.add_argument("--prompts-topic", help="default: ASSEMBLER_PROMPTS_TOPIC")
    rerun.add_argument("--audit-topic", help="default: ASSEMBLER_AUDIT_TOPIC")
    _add_limits(rerun)
    rerun.set_defaults(handler=cmd_replay)

    show = commands.add_parser("policy", help="print the resolved policy and its hash")
    show.add_argument("--policy", help=policy_help)
    show.set_defaults(handler=cmd_policy)
    return parser


def _bug(error: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exception(error)
    print(f"context-assembler: {type(error).__name__}: {printable(str(error))} (this is a bug; "
          "please report it" + ("" if debug else ", with the traceback --debug prints") + ")",
          file=sys.stderr)
    return 70


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    except (KeyError, IndexError) as error:  # LookupErrors no command raises on purpose
        return _bug(error, args.debug)
    except (ContextAssemblerError, LookupError, OSError, RangeError) as error:
        print(f"context-assembler: {printable(str(error))}", file=sys.stderr)
        return 2
    except Exception as error:
        return _bug(error, args.debug)
    return status

