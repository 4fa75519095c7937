"""Eviction: which resident model instance goes when a load needs its memory (`Evictor` plugins)."""
