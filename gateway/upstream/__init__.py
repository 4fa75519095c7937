"""Talking to engines: the shared HTTP client, the request half of the engine dialects (priority, abort,
tokenize), the tokenize call and the SSE relay."""
