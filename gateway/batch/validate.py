"""Checking a batch's input file up front, line by line, before any line runs; and its completion window.

A line is `{"custom_id", "method", "url", "body"}`: `custom_id` a non-empty string unique in the file,
`method` POST, `url` the batch's endpoint, `body` a request for it (checked by the caller's `check`:
the same validation as the route's, and a model berth serves). Each problem is a `LineError` naming
its 1-based line; the first `MAX_ERRORS` are kept. Runs off the event loop (`scan` blocks on reading).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from gateway.batch.model import InputLine, LineError

MAX_ERRORS: Final = 100
#: A line's body checked by the front: (error code, message, param) or None when it may run; and the
#: model it names (the batch's `model` is its first line's).
BodyCheck = Callable[[str, dict[str, Any]], tuple[str, str, str | None] | None]

_WINDOW: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def window_seconds(text: object, max_s: float) -> float:
    """The seconds of a completion window: OpenAI's `24h`, or (a berth extension) any number of seconds,
    minutes, hours or days (`90s`, `30m`, `2h`, `7d`) up to `max_s`. Raises ValueError with the reason."""
    m = _WINDOW.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"expected a duration such as '24h', '30m' or '90s', got {str(text)[:40]!r}")
    s = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not 0 < s <= max_s:
        raise ValueError(f"must be more than 0 and at most {max_s:g} seconds, got {text!r}")
    return s


@dataclass
class Scan:
    lines: list[InputLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    model: str | None = None
    too_many: bool = False

    def fail(self, line: int, code: str, message: str, param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(LineError(code=code, message=message, param=param, line=line))


def scan(path: Path, endpoint: str, max_lines: int, check: BodyCheck) -> Scan:
    """Every line of the input file at `path` checked; where the valid ones lie."""
    out = Scan()
    seen: dict[str, int] = {}
    offset = 0
    n = 0
    with path.open("rb") as f:
        for raw in f:
            start, offset = offset, offset + len(raw)
            text = raw.strip()
            if not text:
                continue  # a blank line (a trailing newline, most often) is no request
            n += 1
            if n > max_lines:
                out.too_many = True
                break
            x = _line(out, n, text, endpoint, check=check, seen=seen)
            if x is not None:
                out.lines.append(InputLine(n, x, start, len(raw)))
    if out.too_many:
        out.errors.insert(
            0,
            LineError(
                code="too_many_requests",
                message=f"the input file has more than {max_lines} requests (the limit of one batch)",
                line=max_lines + 1,
            ),
        )
        del out.errors[MAX_ERRORS:]
    elif n == 0:
        out.errors.append(LineError(code="empty_file", message="the input file holds no requests"))
    return out


def _line(
    out: Scan, n: int, text: bytes, endpoint: str, *, check: BodyCheck, seen: dict[str, int]
) -> str | None:
    """The custom_id of a valid line; None (and its problem noted) otherwise."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        out.fail(n, "invalid_json_line", f"line {n} is not valid JSON: {e}")
        return None
    if not isinstance(obj, dict):
        out.fail(n, "invalid_json_line", f"line {n} must be a JSON object")
        return None
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        out.fail(n, "missing_required_parameter", "custom_id must be a non-empty string", "custom_id")
        return None
    first = seen.setdefault(cid, n)
    if first != n:
        out.fail(n, "duplicate_custom_id", f"custom_id {cid[:100]!r} is also on line {first}", "custom_id")
        return None
    if obj.get("method") != "POST":
        out.fail(n, "invalid_method", "method must be 'POST'", "method")
        return None
    url = obj.get("url")
    if url != endpoint:
        out.fail(
            n, "invalid_url", f"url {str(url)[:100]!r} does not match the batch's endpoint {endpoint}", "url"
        )
        return None
    body = obj.get("body")
    if not isinstance(body, dict):
        out.fail(n, "invalid_request", "body must be a JSON object", "body")
        return None
    problem = check(endpoint, body)
    if problem is not None:
        code, message, param = problem
        out.fail(n, code, message, f"body.{param}" if param else "body")
        return None
    if out.model is None and isinstance(body.get("model"), str):
        out.model = body["model"]
    return cid


def body_of(line: bytes) -> bytes:
    """The `body` of a line that passed `scan`, as JSON bytes."""
    return orjson.dumps(orjson.loads(line)["body"])
