"""Looking at decisions: explain (tables, budget sweeps, charts) and compare (published
against replayed)."""
