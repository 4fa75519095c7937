"""Diagnostics (`berth-loadgen diag NAME`): tools that look into one cost or one stall and print figures
without a target (docs/diagnostics.md); benchmarks, which judge targets, are in `loadgen.bench`."""
