"""`context-assembler`: assemble, explain and sweep over JSONL files; the worker commands.

Exit status: 0 when every line was assembled, 1 when some line was rejected, 2 for a
usage or policy error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from worker import __version__, filemode
from worker.codec import Limits, RejectedInput, decode_event
from worker.engine import PolicyError, assemble
from worker.explain import SEED_BUDGETS, decision_table, sweep, sweep_chart, sweep_table
from worker.policies import PolicyRegistry, load_policy, preset_names


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
def _output(path: str | None, default: BinaryIO | None) -> Iterator[BinaryIO | None]:
    if path is None or path == "-":
        yield default
    else:
        with open(path, "wb") as stream:
            yield stream


def cmd_assemble(args: argparse.Namespace) -> int:
    registry = PolicyRegistry(load_policy(args.policy))
    with (
        _inputs(args.files) as sources,
        _output(args.out, sys.stdout.buffer) as prompts,
        _output(args.audit, None) as audits,
        _output(args.errors, sys.stderr.buffer) as errors,
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


def _events(args: argparse.Namespace) -> Iterator[tuple[str, bytes]]:
    with _inputs([args.events]) as sources:
        for name, stream in sources:
            for number, line in enumerate(stream, start=1):
                if line.strip():
                    yield f"{name}:{number}", line.rstrip(b"\r\n")


def _selected_events(args: argparse.Namespace) -> Iterator[tuple[str, bytes]]:
    found = False
    for origin, raw in _events(args):
        try:
            event = decode_event(raw, _limits(args))
        except RejectedInput as error:
            print(f"{origin}: skipped: {error.reason}: {error.message}", file=sys.stderr)
            continue
        if args.request_id in (None, event.request_id):
            found = True
            yield origin, raw
    if args.request_id is not None and not found:
        raise LookupError(f"request {args.request_id!r} is not in {args.events}")


def cmd_explain(args: argparse.Namespace) -> int:
    registry = PolicyRegistry(load_policy(args.policy))
    for _, raw in _selected_events(args):
        event = decode_event(raw, _limits(args))
        policy = registry.resolve(event.policy, event.request_id)
        print(decision_table(event, assemble(event, policy).audit, policy))
        print()
    return 0


def _budgets(text: str | None) -> list[int]:
    if not text:
        return SEED_BUDGETS
    budgets: list[int] = []
    for part in text.split(","):
        if ":" in part:
            start, stop, step = (int(x) for x in part.split(":"))
            budgets.extend(range(start, stop + 1, step))
        else:
            budgets.append(int(part))
    return budgets


def cmd_sweep(args: argparse.Namespace) -> int:
    registry = PolicyRegistry(load_policy(args.policy))
    for _, raw in _selected_events(args):
        event = decode_event(raw, _limits(args))
        policy = registry.resolve(event.policy, event.request_id)
        points = sweep(event, policy, _budgets(args.budgets))
        print(sweep_table(event, points))
        if args.png:
            png = Path(args.png)
            if args.request_id is None:  # one chart per request
                png = png.with_name(f"{png.stem}-{event.request_id}{png.suffix}")
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
    from worker.settings import SettingsError, load_settings

    try:
        settings = load_settings()
    except SettingsError as error:
        print(f"context-assembler: {error}", file=sys.stderr)
        return 2
    return run_worker(settings)


def cmd_produce(args: argparse.Namespace) -> int:
    import asyncio

    from worker.kafka.produce import produce
    from worker.settings import SettingsError, load_settings

    try:
        settings = load_settings()
    except SettingsError as error:
        print(f"context-assembler: {error}", file=sys.stderr)
        return 2
    servers = args.bootstrap_servers or settings.bootstrap_servers
    topic = args.topic or settings.input_topic
    with _inputs(args.files) as sources:
        lines = (line for _, stream in sources for line in stream)
        sent = asyncio.run(produce(servers, topic, lines))
    print(f"sent {sent} events to {topic}", file=sys.stderr)
    return 0


def _add_limits(parser: argparse.ArgumentParser) -> None:
    defaults = Limits()
    parser.add_argument("--max-event-bytes", type=int, default=defaults.max_event_bytes)
    parser.add_argument("--max-chunks", type=int, default=defaults.max_chunks)
    parser.add_argument("--max-chunk-chars", type=int, default=defaults.max_chunk_chars)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="context-assembler", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True)
    policy_help = f"TOML policy file or preset ({', '.join(preset_names())}); default: default"

    run = commands.add_parser(
        "assemble", help="RetrievalResult JSONL in, AssembledPrompt JSONL out"
    )
    run.add_argument("files", nargs="*", help="JSONL files, or - for stdin (the default)")
    run.add_argument("--policy", help=policy_help)
    run.add_argument("--out", help="AssembledPrompt JSONL (default: stdout)")
    run.add_argument("--audit", help="AssemblyAudit JSONL (default: not written)")
    run.add_argument("--errors", help="error records JSONL (default: stderr)")
    _add_limits(run)
    run.set_defaults(handler=cmd_assemble)

    explain = commands.add_parser("explain", help="one table per request: kept, or dropped and why")
    explain.add_argument("request_id", nargs="?", help="only this request (default: all)")
    explain.add_argument("--events", default="-", help="RetrievalResult JSONL (default: stdin)")
    explain.add_argument("--policy", help=policy_help)
    _add_limits(explain)
    explain.set_defaults(handler=cmd_explain)

    sweeper = commands.add_parser("sweep", help="what fits at each passage budget")
    sweeper.add_argument("request_id", nargs="?", help="only this request (default: all)")
    sweeper.add_argument("--events", default="-", help="RetrievalResult JSONL (default: stdin)")
    sweeper.add_argument("--policy", help=policy_help)
    sweeper.add_argument("--budgets", help="e.g. 100:1000:50,1500 (the default, seed 000's slider)")
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

    show = commands.add_parser("policy", help="print the resolved policy and its hash")
    show.add_argument("--policy", help=policy_help)
    show.set_defaults(handler=cmd_policy)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except (PolicyError, LookupError, OSError) as error:
        print(f"context-assembler: {error}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
