"""Where a simulation's wall time goes: berth's scheduler, its telemetry, its admission, or the simulator
itself (engines, clients, the event loop, the report). Each call the simulator makes into berth's
components is timed (a call made from inside another timed call counts for the outer one: the
scheduler's work for telemetry counts as telemetry); the rest of the run is the simulator's.

Timing every call costs about half a microsecond each, so a run measured with shares is a little slower
than one without (the benchmark says which it ran).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from loadgen.fleetsim.sim import Simulation

#: The scheduler's methods the simulator calls (directly or through its gateway's helpers).
SCHEDULER: Final = (
    "submit",
    "complete",
    "cancel",
    "tick",
    "progress",
    "progress_many",
    "take_preemptions",
    "take_faults",
    "engine_priority",
    "queue_depths",
    "endpoint_ids",
    "endpoint_view",
)


class Shares:
    """Seconds spent in each labelled part, outermost call wins."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._inside = False

    def wrap(self, obj: object, names: tuple[str, ...], label: str) -> None:
        """Time `obj`'s methods `names` (bound methods replaced on the instance) under `label`."""
        self.seconds.setdefault(label, 0.0)
        self.calls.setdefault(label, 0)
        for name in names:
            setattr(obj, name, self._timed(getattr(obj, name), label))

    def _timed(self, f: Callable[..., Any], label: str) -> Callable[..., Any]:
        clock = time.perf_counter
        seconds = self.seconds
        calls = self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._inside:
                return f(*args, **kwargs)
            self._inside = True
            t0 = clock()
            try:
                return f(*args, **kwargs)
            finally:
                seconds[label] += clock() - t0
                calls[label] += 1
                self._inside = False

        return timed


def instrument(sim: Simulation) -> Shares:
    """Time `sim`'s calls into berth: "scheduler", "telemetry" (its loop's turns, scrapes, the prefix
    index told of each dispatch, and the finish phase's records), "admission" (the front's parse, SLO
    resolution and the scheduler's request)."""
    shares = Shares()
    gw = sim.gw
    shares.wrap(gw.scheduler, SCHEDULER, "scheduler")
    shares.wrap(gw.telemetry, ("step",), "telemetry")
    shares.wrap(gw, ("scrape", "dispatched", "finish"), "telemetry")
    shares.wrap(gw, ("admit",), "admission")
    return shares


def split(shares: Shares, wall_s: float) -> dict[str, float]:
    """Each part's seconds and the simulator's (the rest of `wall_s`)."""
    out = {k: round(v, 3) for k, v in shares.seconds.items()}
    out["simulator"] = round(wall_s - sum(shares.seconds.values()), 3)
    return out
