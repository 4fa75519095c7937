"""Telemetry: what berth measures and fits. The Prometheus text parser and the metric half of the engine
dialects, the per-endpoint scraper and its health state machine, stream timelines, the fitted
performance models and output-length predictors, SLO attainment, and the live telemetry service that
folds finished requests in and hands estimates to the scheduler."""
