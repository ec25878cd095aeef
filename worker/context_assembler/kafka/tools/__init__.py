"""The commands around the worker: produce, read, replay, redrive, topics, ACLs, policies.

Tools never import the runtime (tests/test_layers.py)."""
