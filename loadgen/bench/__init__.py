"""Benchmarks (``python -m loadgen.bench.<name>``); performance is measured here, never asserted in tests."""
