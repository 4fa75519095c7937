"""Concurrency controllers (`gateway.sched.interfaces.ConcurrencyController`)."""
