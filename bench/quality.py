"""Answer quality: how often the prompt still holds the answer, at each budget.

Run `python -m bench.quality` (`make bench-quality`, about a minute): `default`, `focused`
and top-k truncation at 600, 1,200 and 2,400 context tokens on the NQ-open sample shipped in
bench/data (its README says what it is and its licence), then `focused` at every budget
from 300 to 2,400 in steps of 100, to check that a larger budget never keeps fewer answers.
`--data FILE` measures another labelled file; `--strict` exits 1 when a target fails.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from context_assembler.diagnose.evaluate import evaluate, read_labelled, table
from context_assembler.intake.policy_registry import load_preset

SAMPLE = Path(__file__).parent / "data" / "nq-open-sample.jsonl.gz"
BUDGETS = [600, 1200, 2400]
TARGETS = {600: 0.80, 1200: 0.95, 2400: 0.99}  # focused: answers kept at least
STEPS = list(range(300, 2401, 100))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(SAMPLE), help="labelled questions (JSONL[.gz])")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    args = parser.parse_args()
    records = read_labelled(args.data)
    print(f"{len(records)} questions from {args.data}")
    policies = [load_preset("default"), load_preset("focused")]
    scores = evaluate(records, policies, BUDGETS)
    print(table(scores))
    failures = [
        f"focused keeps {100 * (s.answers_kept or 0):.1f} % at {s.budget}, target "
        f"{100 * TARGETS[s.budget]:.0f} %"
        for s in scores
        if s.policy == "focused" and (s.answers_kept or 0) < TARGETS[s.budget]
    ]
    failures += [f"{s.policy} over budget {s.over_budget} times at {s.budget}"
                 for s in scores if s.over_budget or s.failed]
    steps = [s for s in evaluate(records, [load_preset("focused")], STEPS)
             if s.policy == "focused"]
    kept = [round((s.answers_kept or 0) * len(records)) for s in steps]
    print("focused, answers kept from 300 to 2,400 tokens in steps of 100:")
    print(" ".join(str(k) for k in kept))
    failures += [f"focused keeps fewer answers at {b.budget} ({k2}) than at {a.budget} ({k1})"
                 for a, b, k1, k2 in zip(steps, steps[1:], kept, kept[1:], strict=False)
                 if k2 < k1]
    for failure in failures:
        print(f"TARGET MISSED: {failure}")
    if not failures:
        print("every target met")
    return 1 if failures and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
