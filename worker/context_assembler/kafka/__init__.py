"""The Kafka shell around the engine: the handler is broker-free, the rest is transport."""
