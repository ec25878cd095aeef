"""The writers of the generated files: schemas/ (`make schemas`) and docs/settings.md (`make
docs-settings`). Development tools: no module of the worker, serve or the CLI imports them
(tests/test_layers.py)."""
