"""The simulator and the fitted models: the fleet simulator's fidelity to the live path and its scale, and how
well berth's telemetry models predict an engine."""
