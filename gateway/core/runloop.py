"""Running a coroutine as the process's main: on uvloop when it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def run(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it anyway
        asyncio.run(coro)
