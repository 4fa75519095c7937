"""Telemetry: the Prometheus text parser, the per-endpoint scraper and its health state machine."""
