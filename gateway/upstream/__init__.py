"""Talking to engines: the shared HTTP client, engine dialects and the SSE relay."""
