"""Waiting for a launched engine: its health route answers, or the load fails (exit, deadline, stall).

A stall is a load whose processes use no CPU for the model's `stall_timeout_s` while its health route
does not answer (a hung download, a deadlocked worker): waiting out `load_timeout_s` would only delay
the failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from gateway.agent import procs
from gateway.agent.backends import Backend
from gateway.agent.config import ModelSpec
from gateway.agent.contract import ErrorBody, ErrorCode
from gateway.agent.state import InstanceRecord

#: How often a start looks at its loading engine (health, exit, CPU progress).
LOAD_POLL_S: Final = 0.1


def _failure(code: ErrorCode, message: str) -> ErrorBody:
    return ErrorBody(code=code, message=message)


def wait_ready(
    backend: Backend, rec: InstanceRecord, model: ModelSpec, probe: Callable[[str], bool]
) -> ErrorBody | None:
    """Poll the loading engine until its health answers (None) or the load fails (why)."""
    url = rec.health_url
    deadline = time.monotonic() + model.load_timeout_s
    last_cpu = -1
    progress_at = time.monotonic()
    while True:
        if not backend.running(rec):
            status = backend.exit_status(rec)
            how = f" with status {status}" if status is not None else ""
            return _failure(ErrorCode.EARLY_EXIT, f"engine exited{how} before {rec.health_path} answered")
        if probe(url):
            return None
        now = time.monotonic()
        if now >= deadline:
            return _failure(
                ErrorCode.LOAD_TIMEOUT, f"{rec.health_path} did not answer within {model.load_timeout_s}s"
            )
        cpu = procs.cpu_ticks(backend.pids(rec))
        if cpu != last_cpu:
            last_cpu, progress_at = cpu, now
        elif now - progress_at >= model.stall_timeout_s:
            return _failure(
                ErrorCode.STALLED,
                f"the engine used no CPU for {model.stall_timeout_s}s before {rec.health_path} answered",
            )
        time.sleep(min(LOAD_POLL_S, max(0.0, deadline - now)))
