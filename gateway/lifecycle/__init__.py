"""The endpoint set and, later, the instances node agents start: which engines exist and their state."""
