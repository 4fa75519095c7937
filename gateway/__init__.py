"""berth: an SLO-aware gateway for self-hosted LLM fleets."""

__version__ = "0.1.0"
