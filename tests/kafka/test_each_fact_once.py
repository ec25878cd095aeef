"""Each Kafka fact in one place, checked on the source as tests/test_layers.py checks imports:
clients are built only by kafka.clients, tuning numbers are named only in kafka.tuning, and a
broker's error code is read through aiokafka's error classes, never compared with a number."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from aiokafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError

from context_assembler.kafka.errors import answered, too_large

PACKAGE = Path(__file__).resolve().parents[2] / "worker" / "context_assembler"
KAFKA = PACKAGE / "kafka"
CLIENT_CLASSES = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}
# Client arguments that are tuning numbers: a literal one belongs in kafka.tuning.
TUNING_ARGUMENTS = {
    "request_timeout_ms", "linger_ms", "max_batch_size", "heartbeat_interval_ms",
    "session_timeout_ms", "fetch_max_wait_ms", "timeout_ms", "transaction_timeout_ms",
    "max_records", "max_request_size", "retry_backoff_ms", "metadata_max_age_ms",
}
# Where a number says "none" or "one alone" rather than how much (a producer batch of one).
NOT_TUNING = {0, 1}
CODE_NAMES = {"error_code", "errno"}


def _trees(root: Path) -> Iterator[tuple[str, ast.AST]]:
    for path in sorted(root.rglob("*.py")):
        yield str(path.relative_to(PACKAGE)), ast.parse(path.read_text("utf-8"), str(path))


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else None)


def _number(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and type(node.value) in (int, float)
            and node.value not in NOT_TUNING)


def _names_a_code(node: ast.expr) -> bool:
    """`x["error_code"]`, `x.error_code`, `x.errno`."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in CODE_NAMES
    return isinstance(node, ast.Attribute) and node.attr in CODE_NAMES


def _numbered_names(root: Path) -> set[str]:
    """Names a module binds to a whole number (`TOPIC_ALREADY_EXISTS = 36`)."""
    return {target.id for _, tree in _trees(root) for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and type(node.value.value) is int
            for target in node.targets if isinstance(target, ast.Name)}


def _numbers_in(node: ast.expr, numbered: set[str]) -> bool:
    """A whole number, or a name bound to one, or a tuple of either."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_numbers_in(element, numbered) for element in node.elts)
    if isinstance(node, ast.Name | ast.Attribute):
        return (node.id if isinstance(node, ast.Name) else node.attr) in numbered
    return isinstance(node, ast.Constant) and type(node.value) is int


def test_aiokafka_clients_are_built_only_by_the_client_factory() -> None:
    built = [f"{name}:{node.lineno} {_called(node)}"
             for name, tree in _trees(PACKAGE) if name != "kafka/clients.py"
             for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _called(node) in CLIENT_CLASSES]
    assert built == []


def test_client_tuning_numbers_are_named_in_the_tuning_module() -> None:
    literal = [f"{name}:{node.lineno} {keyword.arg}={ast.unparse(keyword.value)}"
               for name, tree in _trees(KAFKA) for node in ast.walk(tree)
               if isinstance(node, ast.Call)
               for keyword in node.keywords
               if keyword.arg in TUNING_ARGUMENTS and _number(keyword.value)]
    assert literal == []


def test_no_broker_error_code_is_compared_with_a_number() -> None:
    numbered = _numbered_names(KAFKA)
    compared = [f"{name}:{node.lineno} {ast.unparse(node)}"
                for name, tree in _trees(KAFKA) for node in ast.walk(tree)
                if isinstance(node, ast.Compare)
                and any(_names_a_code(side) for side in (node.left, *node.comparators))
                and any(_numbers_in(side, numbered) for side in (node.left, *node.comparators))]
    assert compared == []


def test_the_rules_see_what_they_forbid() -> None:
    """The checks above find a construction, a literal tuning number and a literal code."""
    tree = ast.parse('EXISTS = 36\nAIOKafkaProducer(linger_ms=5)\n'
                     'if t["error_code"] in (EXISTS, 3): pass\n')
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert _called(calls[0]) in CLIENT_CLASSES and _number(calls[0].keywords[0].value)
    compare = next(node for node in ast.walk(tree) if isinstance(node, ast.Compare))
    assert _names_a_code(compare.left) and _numbers_in(compare.comparators[0], {"EXISTS"})
    assert not _numbers_in(ast.parse("NoError.errno", mode="eval").body, {"EXISTS"})


def test_answers_are_read_by_error_class() -> None:
    assert answered({"error_code": 36}, TopicAlreadyExistsError)
    assert not answered({"error_code": 36}, UnknownTopicOrPartitionError)
    assert answered({"error_code": 3}, UnknownTopicOrPartitionError)
    assert not too_large(None)
