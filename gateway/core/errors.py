"""Errors that carry their source, whether a retry is allowed, one HTTP status and one outcome label.

Every error a client can see is a `BerthError`; `front` renders it in the OpenAI error shape
`{"error": {"message", "type", "param", "code"}}`. Constructors below are the only way errors are
made, so status, type and outcome stay consistent.
"""

from __future__ import annotations

import enum
from typing import Any

import orjson


class ErrorSource(enum.StrEnum):
    CLIENT = "client"
    UPSTREAM = "upstream"
    INTERNAL = "internal"
    GATEWAY = "gateway"  # capacity decisions of the gateway itself (queue full, no endpoint)


class BerthError(Exception):
    __slots__ = (
        "code",
        "message",
        "outcome",
        "param",
        "retry_after_s",
        "retryable",
        "source",
        "status",
        "type",
    )

    def __init__(
        self,
        *,
        status: int,
        message: str,
        type: str,
        code: str,
        outcome: str,
        source: ErrorSource,
        param: str | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.outcome = outcome
        self.source = source
        self.param = param
        self.retryable = retryable
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}

    def __repr__(self) -> str:
        return f"BerthError({self.status}, {self.code!r}, {self.message!r})"


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> BerthError:
    return BerthError(
        status=400,
        message=message,
        type="invalid_request_error",
        code=code,
        outcome="bad_request",
        source=ErrorSource.CLIENT,
        param=param,
    )


def unauthorized(message: str = "missing or invalid API key") -> BerthError:
    return BerthError(
        status=401,
        message=message,
        type="invalid_request_error",
        code="invalid_api_key",
        outcome="unauthorized",
        source=ErrorSource.CLIENT,
    )


def forbidden(message: str) -> BerthError:
    return BerthError(
        status=403,
        message=message,
        type="invalid_request_error",
        code="forbidden",
        outcome="forbidden",
        source=ErrorSource.CLIENT,
    )


def slo_class_not_allowed(slo_class: str, allowed: tuple[str, ...]) -> BerthError:
    return BerthError(
        status=403,
        message=f"SLO class {slo_class!r} is not allowed for this API key (allowed: {', '.join(allowed)})",
        type="invalid_request_error",
        code="slo_class_not_allowed",
        outcome="forbidden",
        source=ErrorSource.CLIENT,
        param="x-berth-slo-class",
    )


def rate_limited(limit: str, retry_after_s: float) -> BerthError:
    """A tenant's limit (requests_per_s, tokens_per_min, max_concurrency) refused the request."""
    return BerthError(
        status=429,
        message=f"rate limit exceeded: this API key's {limit}",
        type="rate_limit_error",
        code="rate_limited",
        outcome="rate_limited",
        source=ErrorSource.GATEWAY,
        retry_after_s=retry_after_s,
    )


def model_not_found(model: str) -> BerthError:
    return BerthError(
        status=404,
        message=f"The model '{model}' does not exist",
        type="invalid_request_error",
        code="model_not_found",
        outcome="unknown_model",
        source=ErrorSource.CLIENT,
        param="model",
    )


def not_found(path: str) -> BerthError:
    return BerthError(
        status=404,
        message=f"no route for {path}",
        type="invalid_request_error",
        code="not_found",
        outcome="not_found",
        source=ErrorSource.CLIENT,
    )


def method_not_allowed(method: str, path: str, allowed: str) -> BerthError:
    return BerthError(
        status=405,
        message=f"method {method} is not allowed on {path}; use {allowed}",
        type="invalid_request_error",
        code="method_not_allowed",
        outcome="bad_method",
        source=ErrorSource.CLIENT,
    )


def body_too_large(limit: int) -> BerthError:
    return BerthError(
        status=413,
        message=f"request body exceeds the limit of {limit} bytes",
        type="invalid_request_error",
        code="request_too_large",
        outcome="too_large",
        source=ErrorSource.CLIENT,
    )


def queue_full(
    model: str, retry_after_s: float, *, code: str = "queue_full", message: str | None = None
) -> BerthError:
    return BerthError(
        status=429,
        message=message or f"the gateway queue for model '{model}' is full",
        type="rate_limit_error",
        code=code,
        outcome="rejected",
        source=ErrorSource.GATEWAY,
        retry_after_s=retry_after_s,
    )


def no_ready_endpoint(model: str, retry_after_s: float, *, reason: str = "no ready endpoint") -> BerthError:
    return BerthError(
        status=503,
        message=f"{reason} for model '{model}'",
        type="service_unavailable_error",
        code="no_ready_endpoint",
        outcome="unavailable",
        source=ErrorSource.GATEWAY,
        retry_after_s=retry_after_s,
    )


def queue_timeout(model: str, waited_s: float, retry_after_s: float) -> BerthError:
    return BerthError(
        status=503,
        message=f"no endpoint for model '{model}' became free within {waited_s:.1f}s",
        type="service_unavailable_error",
        code="queue_timeout",
        outcome="queue_timeout",
        source=ErrorSource.GATEWAY,
        retry_after_s=retry_after_s,
    )


def shutting_down() -> BerthError:
    return BerthError(
        status=503,
        message="the gateway is shutting down",
        type="service_unavailable_error",
        code="shutting_down",
        outcome="shutdown",
        source=ErrorSource.GATEWAY,
        retry_after_s=1,
    )


def upstream_failed(message: str, *, retryable: bool = True) -> BerthError:
    return BerthError(
        status=502,
        message=message,
        type="upstream_error",
        code="engine_failed",
        outcome="upstream_error",
        source=ErrorSource.UPSTREAM,
        retryable=retryable,
    )


def upstream_status(status: int, message: str) -> BerthError:
    """The engine answered with an error status before any body was relayed; keep its 4xx."""
    if 400 <= status < 500:
        return BerthError(
            status=status,
            message=message,
            type="invalid_request_error",
            code="engine_rejected",
            outcome="engine_rejected",
            source=ErrorSource.UPSTREAM,
        )
    return upstream_failed(f"engine answered {status}: {message}", retryable=True)


def engine_auth_failed(status: int) -> BerthError:
    """The engine refused berth's credentials: a configuration error of the gateway, not the engine
    failing (no retry elsewhere, no health change)."""
    return BerthError(
        status=502,
        message=f"the engine refused the gateway's credentials ({status}); the operator must fix the "
        "endpoint's api_key_env / api_key_file",
        type="upstream_error",
        code="engine_auth_failed",
        outcome="engine_auth_failed",
        source=ErrorSource.UPSTREAM,
        retryable=False,
    )


def upstream_timeout(message: str) -> BerthError:
    return BerthError(
        status=504,
        message=message,
        type="timeout_error",
        code="engine_timeout",
        outcome="timeout",
        source=ErrorSource.UPSTREAM,
        retryable=False,
    )


def internal(message: str = "internal gateway error") -> BerthError:
    return BerthError(
        status=500,
        message=message,
        type="internal_error",
        code="internal_error",
        outcome="internal_error",
        source=ErrorSource.INTERNAL,
    )


class ConfigError(Exception):
    """An invalid configuration value; names the file and the key path (e.g. `endpoints[2].url`)."""

    def __init__(self, message: str, *, path: str = "", file: str = "") -> None:
        self.message = message
        self.path = path
        self.file = file
        super().__init__(str(self))

    def within(self, *, file: str | None = None, prefix: str | None = None) -> ConfigError:
        """The same error located inside `file` and/or under key path `prefix`."""
        path = self.path
        if prefix:
            path = f"{prefix}.{path}" if path and not path.startswith("[") else f"{prefix}{path}"
        return ConfigError(self.message, path=path, file=file if file is not None else self.file)

    def __str__(self) -> str:
        where = ":".join(p for p in (self.file, self.path) if p)
        return f"{where}: {self.message}" if where else self.message
