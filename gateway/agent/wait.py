"""Bounded polling of another process's progress (the only waiting the agent does).

The agent waits on things that have no event it could await from a short-lived CLI (another process's
exit, an HTTP route that starts answering, NVML's memory figure), so it polls with a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

POLL_S: Final = 0.05


def poll_until(done: Callable[[], bool], timeout_s: float, *, interval_s: float = POLL_S) -> bool:
    """Call `done` until it returns True (-> True) or `timeout_s` passed (-> False); at least once."""
    deadline = time.monotonic() + timeout_s
    while True:
        if done():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(interval_s, left))
