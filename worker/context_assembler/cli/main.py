"""`context-assembler`: assemble, explain and sweep over JSONL files; the worker commands.

Exit status: 0 when every line was assembled, 1 when some line was rejected, 2 for a
usage, policy or setup error, 70 for a bug, 130 when interrupted (Ctrl-C), 143 when
terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from types import FrameType

from context_assembler import __version__
from context_assembler.cli import files, kafka
from context_assembler.cli.common import (
    add_limits,
    add_policies,
    add_range,
    port,
    positive,
    seconds,
    stand_in_for_closed_streams,
)
from context_assembler.diagnose.explain import printable
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.intake.policies import preset_names


def _explain(args: argparse.Namespace) -> int:
    """explain reads --events (and --audit) files, or with --kafka the topics."""
    return kafka.cmd_explain(args) if args.kafka else files.cmd_explain(args)


def _serve(args: argparse.Namespace) -> int:
    """serve's module imports asyncio: the file commands start faster without it."""
    from context_assembler.cli import serve

    return serve.cmd_serve(args)


def _policy(args: argparse.Namespace) -> int:
    """policy --diff reads the policies topic, unless --policies names a file."""
    if args.diff and not args.policies:
        return kafka.cmd_policy_diff(args)
    return files.cmd_policy(args)


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
    add_policies(run, policy_help)
    run.add_argument("--out", help="AssembledPrompt JSONL (default: stdout)")
    run.add_argument("--audit", help="AssemblyAudit JSONL, - for stdout (default: not written)")
    run.add_argument("--errors", help="error records JSONL (default: stderr)")
    run.add_argument("--policies", help="write the policy records (as the worker publishes "
                     "them on its policies topic) to this JSONL file")
    add_limits(run)
    run.set_defaults(handler=files.cmd_assemble)

    explain = commands.add_parser("explain", help="one table per request: kept, or dropped and why")
    explain.add_argument("request_id", nargs="?", help="only this request (default: all)")
    explain.add_argument("--events", default="-", help="RetrievalResult JSONL (default: stdin)")
    explain.add_argument("--audit", help="AssemblyAudit JSONL: show the recorded decisions")
    explain.add_argument("--kafka", action="store_true",
                         help="find the audit on the audit topic and its input on the input topic")
    explain.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    explain.add_argument("--audit-topic", help="default: ASSEMBLER_AUDIT_TOPIC")
    explain.add_argument("--from-time", help="search audits from this ISO-8601 time on")
    explain.add_argument("--policies-topic", help="default: ASSEMBLER_POLICIES_TOPIC")
    explain.add_argument("--policies", metavar="F", help="with --kafka: the policy records "
                         "from this JSONL file (assemble --policies), not the topic")
    add_policies(explain, policy_help + " (with --kafka: ASSEMBLER_POLICY_FILE)",
                  "default: none (with --kafka: ASSEMBLER_ALLOWED_POLICIES)")
    add_limits(explain)
    explain.set_defaults(handler=_explain)

    sweeper = commands.add_parser("sweep", help="what fits at each passage budget")
    sweeper.add_argument("request_id", nargs="?", help="only this request (default: all)")
    sweeper.add_argument("--events", default="-", help="RetrievalResult JSONL (default: stdin)")
    add_policies(sweeper, policy_help)
    sweeper.add_argument("--budgets", type=files.parse_budgets,
                         help="e.g. 100:1000:50,1500 (the default, seed 000's slider)")
    sweeper.add_argument("--png", help="also draw the sweep as a PNG chart")
    add_limits(sweeper)
    sweeper.set_defaults(handler=files.cmd_sweep)

    work = commands.add_parser("worker", help="the Kafka worker (settings: ASSEMBLER_* variables)")
    work.set_defaults(handler=kafka.cmd_worker)

    grants = commands.add_parser(
        "acls", help="the ACLs the worker's principal needs, for the configured topics, group "
        "and transactional-id prefix (ASSEMBLER_* variables)")
    grants.add_argument("--principal", required=True, help="e.g. User:assembler, or "
                        "User:CN=assembler for a TLS client certificate")
    grants.add_argument("--format", choices=["kafka-acls", "strimzi"], default="kafka-acls",
                        help="kafka-acls commands (the default) or a Strimzi KafkaUser")
    grants.add_argument("--strimzi-cluster", default="my-cluster",
                        help="the KafkaUser's strimzi.io/cluster label (default: my-cluster)")
    grants.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    grants.set_defaults(handler=kafka.cmd_acls)

    topics = commands.add_parser("topics", help="the worker's topics")
    topics_commands = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_commands.add_parser(
        "create", help="create the worker's topics (ASSEMBLER_*_TOPIC); exit 1 if one exists "
        "with other partitions, replication factor or configs")
    create.add_argument("--partitions", type=positive, default=6, help="default: 6")
    create.add_argument("--replication-factor", type=positive, default=1, help="default: 1")
    create.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    create.set_defaults(handler=kafka.cmd_topics)

    send = commands.add_parser("produce", help="send JSONL events to the input topic")
    send.add_argument("files", nargs="*", help="JSONL files, or - for stdin (the default)")
    send.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    send.add_argument("--topic", help="default: ASSEMBLER_INPUT_TOPIC")
    send.add_argument("--wait", action="store_true",
                      help="return once each event has its prompt (ASSEMBLER_PROMPTS_TOPIC) or "
                      "its dead letter (ASSEMBLER_DLQ_TOPIC); exit 1 if some have neither in "
                      "--timeout")
    send.add_argument("--timeout", type=positive, default=120,
                      help="with --wait: seconds to wait (default: 120)")
    send.set_defaults(handler=kafka.cmd_produce)

    show_outputs = commands.add_parser(
        "tail", help="the last records of the prompts, audit or dead-letter topic, one line each")
    show_outputs.add_argument("output", choices=["prompts", "audit", "dlq"])
    show_outputs.add_argument("-n", "--lines", type=int, default=10,
                              help="how many of the last records (default: 10)")
    show_outputs.add_argument("--follow", "-f", action="store_true",
                              help="then print new records as they come, until Ctrl-C")
    show_outputs.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    show_outputs.add_argument("--topic", help="default: ASSEMBLER_PROMPTS_TOPIC, "
                              "ASSEMBLER_AUDIT_TOPIC or ASSEMBLER_DLQ_TOPIC")
    show_outputs.set_defaults(handler=kafka.cmd_tail)

    rerun = commands.add_parser(
        "replay", help="re-assemble input events from the topic, optionally compare")
    add_range(rerun)
    rerun.add_argument("--count", type=int, help="stop after this many events")
    add_policies(rerun, policy_help + ", or recorded: each event under the policy its "
                  "published prompt names (default: ASSEMBLER_POLICY_FILE)",
                  "default: ASSEMBLER_ALLOWED_POLICIES")
    rerun.add_argument("--policies", metavar="F", help="with --policy recorded: the policy "
                       "records from this JSONL file (assemble --policies), not the topic")
    rerun.add_argument("--policies-topic", help="default: ASSEMBLER_POLICIES_TOPIC")
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
    add_limits(rerun)
    rerun.set_defaults(handler=kafka.cmd_replay)

    http = commands.add_parser("serve", help="the HTTP endpoint: POST /v1/assemble")
    http.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (this machine only)")
    http.add_argument("--port", type=port, default=8000, help="default: 8000 (0: any free port)")
    http.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                      help="JSON log lines on stderr at this level and above (default: INFO)")
    http.add_argument("--max-pending", type=positive, default=64,
                      help="requests waiting for the engine at once, and bodies held of this "
                      "many times --max-event-bytes; more get 503 (default: 64)")
    http.add_argument("--body-timeout", type=seconds, default=10.0,
                      help="seconds a request body may take to arrive after its head (a "
                      "slower client gets 408), and its answer to be read (default: 10)")
    http.add_argument("--idle-timeout", type=seconds, default=75.0,
                      help="seconds a connection may wait for a complete request head, idle "
                      "or slow, before it is closed; behind a load balancer, set it above the "
                      "balancer's idle timeout (default: 75)")
    add_policies(http, policy_help)
    add_limits(http)
    http.set_defaults(handler=_serve)

    show = commands.add_parser(
        "policy", help="print the resolved policy and its hash, or what changed between two "
        "recorded policies")
    show.add_argument("--policy", help=policy_help)
    show.add_argument("--diff", nargs=2, metavar=("HASH_A", "HASH_B"),
                      help="the settings that differ between two recorded policies; exit 1 "
                      "if any does")
    show.add_argument("--policies", metavar="F",
                      help="policy records JSONL (assemble --policies); default: the topic")
    show.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    show.add_argument("--policies-topic", help="default: ASSEMBLER_POLICIES_TOPIC")
    show.set_defaults(handler=_policy)

    drive = commands.add_parser(
        "redrive", help="send dead letters back to the input topic (a dry run without --yes)")
    add_range(drive, "DLQ partition")
    drive.add_argument("--count", type=positive, help="at most this many dead letters")
    drive.add_argument("--max-redrives", type=positive, default=3,
                       help="skip a dead letter re-driven this many times already (default: 3)")
    drive.add_argument("--dry-run", action="store_true",
                       help="show what would be re-driven, grouped by reason (the default)")
    drive.add_argument("--yes", action="store_true",
                       help="publish the original key, value and headers to the input topic")
    drive.add_argument("--bootstrap-servers", help="default: ASSEMBLER_BOOTSTRAP_SERVERS")
    drive.add_argument("--dlq-topic", help="default: ASSEMBLER_DLQ_TOPIC")
    drive.add_argument("--input-topic", help="default: ASSEMBLER_INPUT_TOPIC")
    drive.set_defaults(handler=kafka.cmd_redrive)
    return parser


def _bug(error: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exception(error)
    print(f"context-assembler: {type(error).__name__}: {printable(str(error))} (this is a bug; "
          "please report it" + ("" if debug else ", with the traceback --debug prints") + ")",
          file=sys.stderr)
    return 70


class Terminated(BaseException):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that unfinished output files are
    removed on the way out (no `except Exception` catches it). The worker, serve and
    replay install their own handlers once their event loop runs."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    stand_in_for_closed_streams()
    args = build_parser().parse_args(argv)
    if threading.current_thread() is not threading.main_thread():
        return _run(args)  # called as a library (tests, embedders): signals are not ours
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    try:
        status: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    except Terminated:
        return 128 + signal.SIGTERM
    except ContextAssemblerError as error:  # the one family of errors meant for the operator
        print(f"context-assembler: {printable(str(error))}", file=sys.stderr)
        return 2
    except Exception as error:
        return _bug(error, args.debug)
    return status
