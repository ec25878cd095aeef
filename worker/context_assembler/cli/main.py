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
from typing import TypeAlias

from context_assembler import __version__
from context_assembler.cli import files, kafka
from context_assembler.cli.common import (
    Command,
    add_range,
    add_settings,
    positive,
    read_settings,
    stand_in_for_closed_streams,
)
from context_assembler.contract.catalogue import DEFAULT_PARTITIONS
from context_assembler.diagnose.explain import printable
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.settings import Settings

# What `add_subparsers` returns: `commands.add_parser(name)` adds a subcommand.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _explain(args: argparse.Namespace, settings: Settings) -> int:
    """explain reads --events (and --audit) files, or with --kafka the topics."""
    return (kafka.cmd_explain if args.kafka else files.cmd_explain)(args, settings)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    """serve's module imports asyncio: the file commands start faster without it."""
    from context_assembler.cli import serve

    return serve.cmd_serve(args, settings)


def _policy(args: argparse.Namespace, settings: Settings) -> int:
    """policy --diff reads the policies topic, unless --policies names a file."""
    if args.diff and not args.policies:
        return kafka.cmd_policy_diff(args, settings)
    return files.cmd_policy(args, settings)


def _command(commands: Commands, name: str, handler: Command, help: str,
             reads: str | None = None) -> argparse.ArgumentParser:
    """Subcommand `name`, run by `handler`, with the flags of the settings it reads (those
    of COMMANDS[`reads`], by default of COMMANDS[`name`])."""
    parser = commands.add_parser(name, help=help)
    add_settings(parser, reads or name)
    parser.set_defaults(handler=handler)
    return parser


def _add_assemble(commands: Commands) -> None:
    run = _command(commands, "assemble", files.cmd_assemble,
                   help="RetrievalResult JSONL in, AssembledPrompt JSONL out")
    run.add_argument("files", nargs="*", help="JSONL files, or - for stdin (the default)")
    run.add_argument("--out", help="AssembledPrompt JSONL (default: stdout)")
    run.add_argument("--audit", help="AssemblyAudit JSONL, - for stdout (default: not written)")
    run.add_argument("--errors", help="error records JSONL (default: stderr)")
    run.add_argument("--policies", help="write the policy records (as the worker publishes "
                     "them on its policies topic) to this JSONL file")


def _add_explain(commands: Commands) -> None:
    explain = _command(commands, "explain", _explain,
                       help="one table per request: kept, or dropped and why")
    explain.add_argument("request_id", nargs="?", help="only this request (default: all)")
    explain.add_argument("--events", default="-", help="RetrievalResult JSONL (default: stdin)")
    explain.add_argument("--audit", help="AssemblyAudit JSONL: show the recorded decisions")
    explain.add_argument("--kafka", action="store_true",
                         help="find the audit on the audit topic and its input on the input topic")
    explain.add_argument("--from-time", help="search audits from this ISO-8601 time on")
    explain.add_argument("--policies", metavar="F", help="with --kafka: the policy records "
                         "from this JSONL file (assemble --policies), not the topic")


def _add_sweep(commands: Commands) -> None:
    sweeper = _command(commands, "sweep", files.cmd_sweep, help="what fits at each passage budget")
    sweeper.add_argument("request_id", nargs="?", help="only this request (default: all)")
    sweeper.add_argument("--events", default="-", help="RetrievalResult JSONL (default: stdin)")
    sweeper.add_argument("--budgets", type=files.parse_budgets,
                         help="e.g. 100:1000:50,1500 (the default, seed 000's slider)")
    sweeper.add_argument("--png", help="also draw the sweep as a PNG chart")


def _add_evaluate(commands: Commands) -> None:
    evaluate = _command(commands, "evaluate", files.cmd_evaluate,
                        help="answers and gold passages kept at each budget, per policy")
    evaluate.add_argument("file", help="labelled questions: JSONL (or .jsonl.gz) of "
                          '{"event": ..., "answers": [...], "gold": [chunk ids]}')
    evaluate.add_argument("--policy", dest="policies", action="append", required=True,
                          metavar="P", help="a preset name or a TOML file (repeatable)")
    evaluate.add_argument("--budgets", type=files.parse_budgets, default=[600, 1200, 2400],
                          help="passage budgets, e.g. 300:2400:100 (default 600,1200,2400)")
    evaluate.add_argument("--chart", metavar="FILE.png",
                          help="also draw answers kept against the budget, one line a policy")


def _add_worker(commands: Commands) -> None:
    _command(commands, "worker", kafka.cmd_worker,
             help="the Kafka worker (settings: ASSEMBLER_* variables or flags)")


def _add_acls(commands: Commands) -> None:
    grants = _command(
        commands, "acls", kafka.cmd_acls,
        help="the ACLs the worker's principal needs, for the configured topics, group and "
        "transactional-id prefix")
    grants.add_argument("--principal", required=True, help="e.g. User:assembler, or "
                        "User:CN=assembler for a TLS client certificate")
    grants.add_argument("--format", choices=["kafka-acls", "strimzi"], default="kafka-acls",
                        help="kafka-acls commands (the default) or a Strimzi KafkaUser")
    grants.add_argument("--strimzi-cluster", default="my-cluster",
                        help="the KafkaUser's strimzi.io/cluster label (default: my-cluster)")


def _add_topic_sizes(parser: argparse.ArgumentParser) -> None:
    """--partitions and --replication-factor, given before or after `create` alike: a
    default would let the subcommand's parser overwrite one given before it."""
    parser.add_argument("--partitions", type=positive, default=argparse.SUPPRESS,
                        help=f"default: {DEFAULT_PARTITIONS}")
    parser.add_argument("--replication-factor", type=positive, default=argparse.SUPPRESS,
                        help=f"default: {kafka.DEFAULT_REPLICATION_FACTOR}")


def _add_topics(commands: Commands) -> None:
    topics = _command(
        commands, "topics", kafka.cmd_topics_print,
        help="the worker's topics, printed for others to create: kafka-topics commands or "
        "Strimzi KafkaTopics (nothing is sent to the broker)")
    topics.add_argument("--format", choices=["kafka-topics", "strimzi"], default="kafka-topics",
                        help="kafka-topics commands (the default) or Strimzi KafkaTopic resources")
    topics.add_argument("--strimzi-cluster", default="my-cluster",
                        help="the KafkaTopics' strimzi.io/cluster label (default: my-cluster)")
    _add_topic_sizes(topics)
    topics_commands = topics.add_subparsers(dest="topics_command")
    create = _command(
        topics_commands, "create", kafka.cmd_topics,
        help="create the worker's topics; exit 1 if one exists with other partitions, "
        "replication factor or configs", reads="topics create")
    _add_topic_sizes(create)


def _add_schemas(commands: Commands) -> None:
    schemas = commands.add_parser("schemas", help="the contract's schemas in a schema registry")
    schemas_commands = schemas.add_subparsers(dest="schemas_command", required=True)
    _command(schemas_commands, "register", kafka.cmd_schemas_register,
             help="register the contract's JSON Schemas under their subjects, once each "
             "passed the subject's compatibility check; exit 1 if one did not",
             reads="schemas register")


def _add_produce(commands: Commands) -> None:
    send = _command(commands, "produce", kafka.cmd_produce,
                    help="send JSONL events to the input topic")
    send.add_argument("files", nargs="*", help="JSONL files, or - for stdin (the default)")
    send.add_argument("--wait", action="store_true",
                      help="return once each event has its prompt or its dead letter; exit 1 "
                      "if some have neither in --timeout")
    send.add_argument("--timeout", type=positive, default=120,
                      help="with --wait: seconds to wait (default: 120)")


def _add_tail(commands: Commands) -> None:
    show_outputs = _command(
        commands, "tail", kafka.cmd_tail,
        help="the last records of the prompts, audit or dead-letter topic, one line each")
    show_outputs.add_argument("output", choices=["prompts", "audit", "dlq"])
    show_outputs.add_argument("-n", "--lines", type=int, default=10,
                              help="how many of the last records (default: 10)")
    show_outputs.add_argument("--follow", "-f", action="store_true",
                              help="then print new records as they come, until Ctrl-C")
    show_outputs.add_argument("--topic", help="read this topic (default: the prompts, audit "
                              "or dlq topic setting, as OUTPUT says)")


def _add_replay(commands: Commands) -> None:
    rerun = _command(commands, "replay", kafka.cmd_replay,
                     help="re-assemble input events from the topic, optionally compare")
    add_range(rerun)
    rerun.add_argument("--count", type=int, help="stop after this many events")
    rerun.add_argument("--policy", dest="replay_policy", metavar="POLICY",
                       help="TOML policy file or preset, or recorded: each event under the "
                       "policy its published prompt names (default: ASSEMBLER_POLICY_FILE)")
    rerun.add_argument("--policies", metavar="F", help="with --policy recorded: the policy "
                       "records from this JSONL file (assemble --policies), not the topic")
    rerun.add_argument("--out", help="AssembledPrompt JSONL")
    rerun.add_argument("--audit", help="AssemblyAudit JSONL")
    rerun.add_argument("--errors", help="error records JSONL for rejected events")
    rerun.add_argument("--to-topic", help="publish prompts here (one transaction)")
    rerun.add_argument("--to-audit-topic", help="publish audits here (default: TO_TOPIC.audit)")
    rerun.add_argument("--compare", action="store_true",
                       help="compare with what the worker published; exit 0 only if identical")
    rerun.add_argument("--verbose", action="store_true", help="list identical requests too")


def _add_serve(commands: Commands) -> None:
    _command(commands, "serve", _serve, help="the HTTP endpoint: POST /v1/assemble")


def _add_policy(commands: Commands) -> None:
    show = _command(commands, "policy", _policy,
                    help="print the resolved policy and its hash, or what changed between two "
                    "recorded policies")
    show.add_argument("--diff", nargs=2, metavar=("HASH_A", "HASH_B"),
                      help="the settings that differ between two recorded policies; exit 1 "
                      "if any does")
    show.add_argument("--policies", metavar="F",
                      help="policy records JSONL (assemble --policies); default: the topic")


def _add_redrive(commands: Commands) -> None:
    drive = _command(
        commands, "redrive", kafka.cmd_redrive,
        help="send dead letters back to the input topic (a dry run without --yes)")
    add_range(drive, "DLQ partition")
    drive.add_argument("--count", type=positive, help="at most this many dead letters")
    drive.add_argument("--max-redrives", type=positive, default=3,
                       help="skip a dead letter re-driven this many times already (default: 3)")
    drive.add_argument("--dry-run", action="store_true",
                       help="show what would be re-driven, grouped by reason (the default)")
    drive.add_argument("--yes", action="store_true",
                       help="publish the original key, value and headers to the input topic")
    drive.add_argument("--wait", action="store_true",
                       help="with --yes: return once each re-driven event has its prompt or "
                       "its dead letter; exit 1 if some have neither in --timeout")
    drive.add_argument("--timeout", type=positive, default=120,
                       help="with --wait: seconds to wait (default: 120)")


def _add_citations(commands: Commands) -> None:
    check = _command(commands, "citations", files.cmd_citations,
                     help="check answers' citations against their prompts")
    check.add_argument("--prompts", required=True,
                       help="AssembledPrompt JSONL (as `assemble` writes it)")
    check.add_argument("--answers", required=True,
                       help='answer JSONL: {"request_id", "answer": text or a provider '
                       "response}, - for stdin")
    check.add_argument("--out", help="CitationCheck JSONL (default: stdout)")
    check.add_argument("--errors", help="error records JSONL (default: stderr)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="context-assembler", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an unexpected error")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_add_assemble, _add_explain, _add_sweep, _add_evaluate, _add_worker, _add_acls,
                _add_topics, _add_schemas, _add_produce, _add_tail, _add_replay, _add_serve,
                _add_policy, _add_redrive, _add_citations):
        add(commands)
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
        settings = read_settings(args)
        settings.size_engine_caches()
        status: int = args.handler(args, settings)
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
