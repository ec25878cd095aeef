"""Metrics, health endpoints and structured logs, apart from the delivery code."""
