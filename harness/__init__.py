"""The development harness: real brokers, a schema registry and worker processes on loopback,
for the tests, the benchmarks, the chaos run and the Makefile. Not shipped in the wheel."""
