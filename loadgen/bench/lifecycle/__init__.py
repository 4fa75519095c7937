"""Lifecycle: which models stay resident (eviction), how many instances run (autoscaling), and of which
configuration (MaaSO's heterogeneous instances)."""
