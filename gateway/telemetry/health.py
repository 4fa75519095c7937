"""The endpoint health state machine, sans-IO: check results in, state transitions out.

    STARTING --success--> READY --N failures in a row--> UNHEALTHY --success--> READY
    STARTING --N failures in a row--> UNHEALTHY   (so operators see an engine that never came up)

One success is enough to be READY; `unhealthy_after` (N) consecutive failures make an endpoint
UNHEALTHY from either STARTING or READY. Failures below N change nothing visible.
"""

from __future__ import annotations

from gateway.core.types import EndpointHealth


class HealthTracker:
    __slots__ = ("_failures", "_state", "_unhealthy_after")

    def __init__(self, unhealthy_after: int) -> None:
        self._unhealthy_after = _check(unhealthy_after)
        self._state = EndpointHealth.STARTING
        self._failures = 0

    @property
    def state(self) -> EndpointHealth:
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def unhealthy_after(self) -> int:
        return self._unhealthy_after

    def success(self) -> EndpointHealth | None:
        """A check passed. Returns the new state if this changed it, else None."""
        self._failures = 0
        return self._move(EndpointHealth.READY)

    def failure(self) -> EndpointHealth | None:
        """A check failed. Returns the new state if this changed it, else None."""
        self._failures += 1
        if self._failures >= self._unhealthy_after:
            return self._move(EndpointHealth.UNHEALTHY)
        return None

    def set_unhealthy_after(self, unhealthy_after: int) -> EndpointHealth | None:
        """Change N (config reload). Failures already counted count against the new N, so lowering it
        can make the endpoint UNHEALTHY at once; returns the new state then."""
        self._unhealthy_after = _check(unhealthy_after)
        if self._failures >= self._unhealthy_after:
            return self._move(EndpointHealth.UNHEALTHY)
        return None

    def _move(self, state: EndpointHealth) -> EndpointHealth | None:
        if state is self._state:
            return None
        self._state = state
        return state


def _check(unhealthy_after: int) -> int:
    if unhealthy_after < 1:
        raise ValueError(f"unhealthy_after must be at least 1, got {unhealthy_after}")
    return unhealthy_after
