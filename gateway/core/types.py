"""Vocabulary types shared by every layer (see DESIGN.md, "Vocabulary")."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NewType

from gateway.core.frozen import frozen

RequestId = NewType("RequestId", str)
EndpointId = NewType("EndpointId", str)
ModelName = NewType("ModelName", str)


class InstanceClass(enum.StrEnum):
    """Which traffic an endpoint prefers (Chiron)."""

    INTERACTIVE = "interactive"
    MIXED = "mixed"
    BATCH = "batch"


class EngineKind(enum.StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class EndpointHealth(enum.StrEnum):
    """Endpoint state machine: starting -> ready -> unhealthy -> ready ..."""

    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"


class ApiKind(enum.StrEnum):
    """Which OpenAI route a request came in on."""

    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    RESPONSES = "responses"  # the Responses API (vLLM serves it; the engine keeps the response)

    @property
    def path(self) -> str:
        return _API_PATHS[self]


_API_PATHS: dict[ApiKind, str] = {
    ApiKind.CHAT: "/v1/chat/completions",
    ApiKind.COMPLETION: "/v1/completions",
    ApiKind.EMBEDDING: "/v1/embeddings",
    ApiKind.RESPONSES: "/v1/responses",
}


@dataclass(frozen=True, slots=True)
class SLO:
    """Per-request latency targets in milliseconds; None means "no target"."""

    slo_class: str = "default"
    ttft_ms: float | None = None
    itl_ms: float | None = None
    deadline_ms: float | None = None


@dataclass(frozen=True, slots=True)
class EngineGauges:
    """What one scrape of an engine's /metrics said (None: the engine does not export it)."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # fraction 0..1


@frozen
class ParsedRequest:
    """An OpenAI request body as the front validated it: the fields berth acts on, and the body itself."""

    api: ApiKind
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool  # the client asked for the usage chunk
    max_tokens: int | None
    prompt_chars: int
