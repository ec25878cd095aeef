"""The focusing-share benchmark's stage pass: what it times, and that it leaves the engine
as it found it."""

from __future__ import annotations

from bench.corpus import Corpus
from bench.engine_bench import SEED
from bench.focusing_share import PIPELINE, STAGES, staged
from context_assembler.engine import Policy, assemble, caches
from context_assembler.engine import focus as focus_module
from context_assembler.engine.dedup import CopyDetector
from context_assembler.intake.policy_registry import load_policy


def test_the_stage_pass_times_each_stage_and_restores_the_engine() -> None:
    real = (focus_module._exact, PIPELINE.focus, CopyDetector.find_twin,
            CopyDetector.add_kept)
    focused = load_policy("focused").model_copy(update={"budget": Policy().budget})
    event = Corpus(SEED * 613 + 10).cold_event(10, 0)
    caches.reset()
    expected = assemble(event, focused)
    spent = dict.fromkeys(STAGES, 0)
    caches.reset()
    with staged(spent):
        found = assemble(event, focused)
    assert found == expected  # timing changes nothing the engine gives
    assert expected.audit.kept  # passages were taken from: every stage ran
    assert all(spent[stage] > 0 for stage in STAGES), spent
    assert (focus_module._exact, PIPELINE.focus, CopyDetector.find_twin,
            CopyDetector.add_kept) == real
