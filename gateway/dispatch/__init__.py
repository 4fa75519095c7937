"""Runs placed requests: waits for a slot, calls the engine, relays, retries before the first byte."""
