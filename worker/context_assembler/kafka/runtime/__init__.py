"""The worker: consume, assemble, publish, commit, under either delivery guarantee."""
