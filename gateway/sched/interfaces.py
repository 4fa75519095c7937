"""One Protocol per extension point. Each docstring is the contract; the runner enforces it.

Plugins are synchronous and side-effect free with respect to the fleet: they may keep private state
(a round-robin cursor, a seeded RNG) but never await, do I/O, or mutate the snapshot or request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from gateway.core.types import EndpointId
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot

#: A key orders the queue: smaller keys are served first. Ties break by arrival order.
OrderKey = tuple[float, ...]


class Ordering(Protocol):
    """Priority key of a queued request.

    Called whenever the queue is served, so a key may change as time passes (slack). Must return a
    tuple of finite floats. Must not mutate anything.
    """

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey: ...


class Filter(Protocol):
    """Narrows the candidates for a request.

    Receives endpoints that already serve the model, are not unhealthy and have room under their cap.
    Returns a subset (order does not matter). Returning an empty sequence means "nothing eligible now":
    the request stays queued.
    """

    name: str

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]: ...


class Scorer(Protocol):
    """Scores each candidate in [0, 1], higher is better.

    Endpoints missing from the result score 0. The runner clamps out-of-range values and NaN to [0, 1]
    and multiplies by the profile's weight for this scorer; weights live in the policy, not the plugin.
    """

    name: str

    def score(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Mapping[EndpointId, float]: ...


class Picker(Protocol):
    """Chooses one endpoint from non-empty scored candidates (weighted score sum, higher is better).

    Must return one of the given endpoints. The runner never calls it with an empty sequence.
    """

    name: str

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView: ...
