"""Autoscaling: how many instances of each model run, of which class (`Scaler` plugins)."""
