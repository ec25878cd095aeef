"""The chaos run (`make chaos`): workers on a three-node Kafka cluster, faults injected on a
seeded schedule, verdicts read from the topics afterwards. See `bench.chaos.run`."""
