"""The HTTP front: routes, OpenAI request validation, SSE writing and error mapping."""
