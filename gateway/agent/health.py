"""The engine's health route, probed over HTTP (urllib: the agent is a short-lived synchronous CLI)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Final

PROBE_TIMEOUT_S: Final = 2.0


def healthy(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether GET `url` answers 2xx within `timeout_s` (refused, 5xx, timeouts: False)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
