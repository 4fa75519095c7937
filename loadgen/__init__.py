"""Load generation, engine simulation and benchmarks for berth."""
