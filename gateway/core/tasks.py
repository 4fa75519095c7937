"""The task supervisor: every background task is named, referenced and supervised.

A task that dies with an exception is logged with its name and, unless it was started with
`restart=False`, started again after a short back-off. `close()` cancels and awaits them all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

log = structlog.get_logger("berth.tasks")


class TaskSupervisor:
    def __init__(self, *, restart_delay_s: float = 1.0) -> None:
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._restart_delay_s = restart_delay_s
        self._closing = False

    @property
    def names(self) -> list[str]:
        return sorted(self._tasks)

    def spawn(
        self, name: str, factory: Callable[[], Coroutine[Any, Any, Any]], *, restart: bool = True
    ) -> asyncio.Task[Any]:
        """Start `factory()` as task `name`; names are unique while the task lives."""
        if name in self._tasks and not self._tasks[name].done():
            raise ValueError(f"a task named {name!r} is already running")
        task = asyncio.get_running_loop().create_task(self._run(name, factory, restart), name=name)
        self._tasks[name] = task
        task.add_done_callback(lambda t: self._tasks.pop(name, None) if self._tasks.get(name) is t else None)
        return task

    async def _run(self, name: str, factory: Callable[[], Awaitable[Any]], restart: bool) -> None:
        while True:
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("task_failed", task=name, restart=restart and not self._closing)
                if not restart or self._closing:
                    return
                await asyncio.sleep(self._restart_delay_s)

    def discard(self, name: str) -> None:
        """Cancel task `name` without waiting for it to finish."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def cancel(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        self._closing = True
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
