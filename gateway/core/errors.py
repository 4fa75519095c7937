"""Errors that carry their source, whether a retry is allowed, one HTTP status and one outcome label.

Every error a client can see is a `BerthError`; `front` renders it in the OpenAI error shape
`{"error": {"message", "type", "param", "code"}}`. Constructors below are the only way errors are
made, so status, type and outcome stay consistent. They stay in one module (a little over the size rule)
so that every code a client can see is listed in one place.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Final

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


#: At most this many model names in an unknown model's 404.
MAX_LISTED_MODELS: Final = 20


def model_not_found(model: str, served: Iterable[str] = ()) -> BerthError:
    """404 for `model`; the message lists the `served` names (sorted, at most MAX_LISTED_MODELS)."""
    names = sorted(set(served))
    message = f"The model '{model}' does not exist"
    if names:
        listed = ", ".join(names[:MAX_LISTED_MODELS])
        more = len(names) - MAX_LISTED_MODELS
        message += f"; served models: {listed}" + (f" and {more} more (GET /v1/models)" if more > 0 else "")
    return BerthError(
        status=404,
        message=message,
        type="invalid_request_error",
        code="model_not_found",
        outcome="unknown_model",
        source=ErrorSource.CLIENT,
        param="model",
    )


def not_found(path: str) -> BerthError:
    return object_not_found(f"no route for {path}")


def object_not_found(message: str, param: str | None = None) -> BerthError:
    """A 404 for something the client named (a route, a file, a batch, a response) that is not there
    for it."""
    return BerthError(
        status=404,
        message=message,
        type="invalid_request_error",
        code="not_found",
        outcome="not_found",
        source=ErrorSource.CLIENT,
        param=param,
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


def unsupported_media_type(content_type: str) -> BerthError:
    return BerthError(
        status=415,
        message=f"the request body must be JSON (Content-Type: application/json), got {content_type[:100]!r}",
        type="invalid_request_error",
        code="unsupported_media_type",
        outcome="bad_request",
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


def model_load_failed(model: str, reason: str, retry_after_s: float) -> BerthError:
    """A request waited for its model to be loaded by a node agent, and the load failed."""
    return BerthError(
        status=503,
        message=f"loading model '{model}' failed: {reason}",
        type="service_unavailable_error",
        code="model_load_failed",
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


def limits_unavailable(retry_after_s: float) -> BerthError:
    """Cluster mode with `on_redis_down = "refuse"`: the shared tenant limits cannot be checked."""
    return BerthError(
        status=503,
        message="the tenant's rate limits cannot be checked now (the cluster's store does not answer)",
        type="service_unavailable_error",
        code="limits_unavailable",
        outcome="limits_unavailable",
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


def upstream_pool_exhausted(limit: str, size: int, waited_s: float, *, retryable: bool) -> BerthError:
    """No connection of the gateway's own pool came free within `waited_s` (`limit`: the `[upstream]`
    key that held it, `size` its value): the gateway's capacity, not an engine failure."""
    return BerthError(
        status=503,
        message=(
            f"no free connection to the engine within {waited_s:g}s: the gateway's engine connections "
            f"are all in use (upstream.{limit} = {size})"
        ),
        type="service_unavailable_error",
        code="upstream_pool_exhausted",
        outcome="unavailable",
        source=ErrorSource.GATEWAY,
        retryable=retryable,
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


def upstream_status(
    status: int, message: str, *, type: str | None = None, param: str | None = None, code: str | None = None
) -> BerthError:
    """The engine answered with an error status before any body was relayed; keep its 4xx, with the
    engine's own error type, param and (a string) code where it gave them."""
    if 400 <= status < 500:
        return BerthError(
            status=status,
            message=message,
            type=type or "invalid_request_error",
            code=code or "engine_rejected",
            outcome="engine_rejected",
            source=ErrorSource.UPSTREAM,
            param=param,
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


#: Longest message taken from an engine's error, and longest excerpt of a body that is not JSON.
MAX_ENGINE_MESSAGE: Final = 2000
MAX_ENGINE_EXCERPT: Final = 500


def engine_error(status: int, body: bytes, reason: str = "") -> BerthError:
    """`upstream_status` for an engine's error answer `body` (as much of it as was read).

    An OpenAI-shaped error (`{"error": {"message", "type", "param", "code"}}`, or those keys at the top
    level as older vLLM sent them) keeps its message, type, param and string code; FastAPI's
    `{"detail": ...}` becomes a message (and a param from the first error's location). Other JSON is
    described, not pasted into the message; a body that is not JSON becomes a bounded excerpt.
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = " ".join(body.decode("utf-8", "replace").split())
        if len(text) > MAX_ENGINE_EXCERPT:
            text = text[:MAX_ENGINE_EXCERPT] + "..."
        return upstream_status(status, text or reason or f"engine answered {status}")
    fields = _openai_error(obj) or _fastapi_error(obj)
    if fields is None:
        keys = f" with keys {', '.join(sorted(obj)[:10])}" if isinstance(obj, dict) and obj else ""
        message = f"engine answered {status} with a JSON {_json_kind(obj)}{keys} but no error message"
        return upstream_status(status, message)
    message, type_, param, code = fields
    return upstream_status(status, message[:MAX_ENGINE_MESSAGE], type=type_, param=param, code=code)


_Fields = tuple[str, str | None, str | None, str | None]


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _openai_error(obj: Any) -> _Fields | None:
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, str) and err:  # {"error": "message"} (TGI, some proxies)
        return err, _text(obj.get("error_type")), None, None
    found = err if isinstance(err, dict) else obj
    message = found.get("message")
    if not isinstance(message, str):
        return None
    return message, _text(found.get("type")), _text(found.get("param")), _text(found.get("code"))


def _fastapi_error(obj: Any) -> _Fields | None:
    detail = obj.get("detail") if isinstance(obj, dict) else None
    if isinstance(detail, str) and detail:
        return detail, None, None, None
    if not isinstance(detail, list) or not detail:
        return None
    parts: list[str] = []
    param: str | None = None
    for item in detail:
        if not isinstance(item, dict):
            continue
        loc = item.get("loc")
        where = ".".join(str(p) for p in loc) if isinstance(loc, list) else ""
        param = param or where or None
        msg = item.get("msg")
        parts.append(f"{where}: {msg}" if where else str(msg))
    if not parts:
        return None
    return "; ".join(parts), None, param, None


def _json_kind(obj: Any) -> str:
    if isinstance(obj, dict):
        return "object"
    if isinstance(obj, list):
        return "array"
    return "string" if isinstance(obj, str) else "value"


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
