"""Metrics.observe counts per label from children looked up once, dropped chunks tallied
per reason: the totals must be those of counting every chunk one by one."""

from collections import Counter

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.records import HandlerContext, Origin, handle
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings
from tests.factories import EXAMPLES, chunk, event


def test_chunk_and_token_totals_are_the_sums_over_every_audit() -> None:
    context = HandlerContext(settings=Settings(prompts_topic="p", audit_topic="a",
                                               dlq_topic="d", group_id="w"),
                             registry=PolicyRegistry(Policy()))
    metrics = Metrics()
    decisions: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    text = "The quarterly report lists revenue by region and the cost of each product line."
    copies = event([chunk(f"c{n}", text, score=1.0 - n / 10) for n in range(4)])
    lines = [*(EXAMPLES / "events.jsonl").read_bytes().splitlines(),
             copies.model_dump_json().encode()]
    for offset, raw in enumerate(lines * 2):
        outcome = handle(raw, Origin("in", 0, offset, None, (), None), context)
        metrics.observe(outcome.assembly, outcome.rejected, 0.001)
        if outcome.assembly is not None:
            audit = outcome.assembly.audit
            decisions["kept"] += len(audit.kept)
            decisions.update(dropped.reason.value for dropped in audit.dropped)
            tokens.update(context=audit.tokens.context, prompt=audit.tokens.prompt)
    assert decisions["duplicate"] + decisions["near_duplicate"] >= 6  # 3 from one audit, twice

    def sample(name: str, labels: dict[str, str]) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    for decision, count in decisions.items():
        assert sample("context_assembler_chunks_total", {"decision": decision}) == count
    for part, count in tokens.items():
        assert sample("context_assembler_tokens_total", {"part": part}) == count
