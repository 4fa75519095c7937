"""The fleet simulator's state, shared by its parts (`sim`: the loop and the report; `sim_client`: the
clients; `sim_engines`: the engines and their runs; `sim_decisions`: berth's decisions carried out), and
the event kinds of its heap."""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Sequence
from typing import Any, Final

from gateway.core.errors import BerthError
from gateway.core.types import ApiKind, EndpointId, ModelName, RequestId
from gateway.sched.decisions import Decision
from loadgen.client import RequestResult
from loadgen.engine_sim.engine import SimRequest
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.clock import VirtualClock
from loadgen.fleetsim.gateway import SimGateway
from loadgen.fleetsim.lifecycle import SimLifecycle
from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.streams import Call, Endpoint, Reports
from loadgen.fleetsim.timeline import FleetTimeline
from loadgen.report import GapHistogram, TaskResult

TICK_S: Final = 0.1
#: Finished requests' gaps are counted into the report's histograms this many at a time.
GAP_BATCH: Final = 65536

_API: Final = {"chat": ApiKind.CHAT, "completion": ApiKind.COMPLETION}

# Event kinds, in the order events of the same instant are handled (a progress report is a token's, as
# an engine's wake is).
_WAKE, _SEND, _ARRIVE, _TICK, _SCRAPE, _REFRESH, _SAMPLE, _CHECK, _DRAIN, _LIFE, _PUBLISH = range(11)
_REPORT: Final = _WAKE

#: An event: (time, kind, sequence number, what it concerns); events are handled in this order.
Event = tuple[float, int, int, Any]


class SimState:
    """What every part of the simulation reads and writes (set up by `Simulation.__init__`), the event
    heap, and the methods one part calls in another (each defined by its part)."""

    opts: SimOptions
    clock: VirtualClock
    gws: list[SimGateway]
    gw: SimGateway
    models: list[str]
    _turn: int
    _templates: dict[tuple[ModelName, str | None], EndpointSpec]
    endpoints: list[Endpoint]
    _by_id: dict[EndpointId, Endpoint]
    _caching: bool
    _heap: list[Event]
    _reports: list[Event]
    _seq: itertools.count[int]
    _running: dict[RequestId, Call]
    _on_engine: dict[SimRequest, Call]
    _progress_out: list[Any]  # Progress with one replica, else tuple[SimGateway, Progress]
    requests: list[RequestResult]
    tasks: list[TaskResult]
    gaps: dict[str, GapHistogram]
    _gap_buffer: dict[str, array[float]]
    timeline: FleetTimeline
    events: int
    faults: int
    preemptions: int
    resumes: int
    recomputed_tokens: int
    _open_tasks: int
    _last_arrival: float
    _draining_until: float
    _ended: bool
    life: SimLifecycle | None

    def push(self, t: float, kind: int, obj: Any = None) -> None:
        heapq.heappush(self._heap, (t, kind, next(self._seq), obj))

    def push_report(self, t: float, plan: Reports) -> None:
        """A run's next iteration with progress reports, at `t`: an event of its own queue (`_reports`),
        in the same order as the others (its sequence number is theirs), handed out in a burst before the
        next of them (`Simulation._loop`)."""
        heapq.heappush(self._reports, (t, _REPORT, next(self._seq), plan))

    def _busy(self) -> bool:
        """Whether anything can still happen (tasks open): periodic events stop once nothing can."""
        return self._open_tasks > 0

    # ----------------------------------------------------------------- defined by the parts
    def _apply(
        self, decisions: Sequence[Decision], gw: SimGateway | None = None
    ) -> None: ...  # sim_decisions

    def _count_faults(self) -> None: ...  # sim_decisions

    def _reject(self, call: Call, err: BerthError) -> None: ...  # sim_client

    def _client_done(self, call: Call, *, ok: bool, error: str | None = None) -> None: ...  # sim_client

    def _step(self, ep: Endpoint) -> None: ...  # sim_engines

    def _sync(self, ep: Endpoint) -> None: ...  # sim_engines

    def _cut(self, ep: Endpoint) -> None: ...  # sim_engines

    def _record_stream(self, call: Call) -> None: ...  # sim_engines
