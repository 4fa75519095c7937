"""Queue orderings."""
