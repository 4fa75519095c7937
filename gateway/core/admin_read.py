"""Reading one admin document of a running gateway over HTTP (`berth top`, `berth cluster`): a blocking
GET with the admin token, and the JSON object it answers, or `AdminReadError` saying why not."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import orjson


class AdminReadError(Exception):
    """The gateway could not be read; the message starts with its URL and says why."""


def read_admin(url: str, path: str, token: str | None, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """The JSON object at `path` of the gateway at `url` (the admin token as a bearer token, if any)."""
    req = urllib.request.Request(url.rstrip("/") + path, headers={"Accept": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:
        raise AdminReadError(f"{url}: HTTP {e.code}: {_error_message(e.read())}") from None
    except (urllib.error.URLError, OSError) as e:
        raise AdminReadError(f"{url}: {getattr(e, 'reason', e)}") from None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise AdminReadError(f"{url}: the answer is not JSON") from None
    if not isinstance(doc, dict):
        raise AdminReadError(f"{url}: unexpected answer")
    return doc


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else the body's start."""
    try:
        doc = orjson.loads(body)
        return str(doc["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body.decode("utf-8", "replace").strip()[:200] or "no details"
