"""The scheduler core: sans-IO, synchronous, driven by the daemon, the offline simulator and tests.

Nothing in this package awaits, opens a socket or reads the wall clock: time comes from the Clock it is
given and every input arrives as a method call (an event) that returns decisions.
"""
