"""The scheduler's bookkeeping (`gateway.sched.scheduler.Scheduler` is built on it): what it holds (the
fleet, the queues, the policy and limits, engine priorities, places in arrival order), the outboxes a
driver drains (faults, cold models, preemptions), and the read-only views of that state (snapshots,
queue depths, where a request runs, an endpoint's cap and view). Nothing here makes a decision; the
events that do (submit, serve, complete, tick, preemption, caps) are in `gateway.sched.scheduler` and
`gateway.sched.preempting`. Sans-IO."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from gateway.core.clock import Clock
from gateway.core.types import EndpointId, ModelName, RequestId
from gateway.sched.admission import AdmissionLedger
from gateway.sched.decisions import FaultStage, PolicyFault, Preempt
from gateway.sched.fleet import Fleet, Progress
from gateway.sched.profile import Policy
from gateway.sched.queues import Queues
from gateway.sched.request import SchedRequest
from gateway.sched.slices import SERVE_SLICE, ServeSlices
from gateway.sched.snapshot import EndpointView, FleetSnapshot, ViewsMemo
from gateway.sched.types import QueueLimits
from gateway.sched.victims import Victims

#: Faults kept for the daemon to collect (the oldest are dropped beyond this).
MAX_FAULTS: Final = 64


class SchedulerBooks:
    """The scheduler's state and its read-only views; `Scheduler` extends it with the events."""

    def __init__(self, policy: Policy, clock: Clock, limits: QueueLimits | None = None) -> None:
        self._policy = policy
        self._clock = clock
        self._limits = limits or QueueLimits()
        self._fleet = Fleet()
        self._queues = Queues()
        # Engine priority of requests dispatched to priority-scheduling endpoints (see engine_priority).
        self._priorities: dict[RequestId, int] = {}
        self.admission = AdmissionLedger()
        self.faults: list[PolicyFault] = []  # the daemon takes and logs them (take_faults)
        # Models the lifecycle can load on demand, and how long a request may wait for such a load.
        self._loadable: frozenset[ModelName] = frozenset()
        self._load_deadline_s = 0.0
        # `known_models` as last made, with the two sets it was made from.
        self._known: tuple[frozenset[ModelName], frozenset[ModelName], frozenset[ModelName]] = (
            frozenset(),
            frozenset(),
            frozenset(),
        )
        self.cold: list[ModelName] = []  # loadable models requested with no ready endpoint (take_cold)
        # Preemptions made during a submit (take_preemptions; a driver may look at it first, as at `faults`
        # and `cold`, to skip the call when it is empty).
        self.outbox: list[Preempt] = []
        # Place in arrival order of each running request (a preempted one keeps it when requeued).
        self._seqs: dict[RequestId, int] = {}
        # The running requests each endpoint's view lets be preempted, kept per view.
        self._victim_finder = Victims()
        # Requests one call tries to place at most, and the serves a call cut short (gateway.sched.slices).
        self.serve_slice = SERVE_SLICE
        self._slices = ServeSlices()
        # The memo of the last snapshot's views (`snapshot`: the next snapshot of the same views shares it).
        self._memo: ViewsMemo | None = None

    def _fault(self, req: SchedRequest, stage: FaultStage, error: Exception) -> None:
        self._fault_id(req.id, stage, error)

    def _fault_id(self, req_id: RequestId, stage: FaultStage, error: Exception) -> None:
        self.faults.append(PolicyFault(req_id, stage, error))
        if len(self.faults) > MAX_FAULTS:
            del self.faults[0]

    def take_faults(self) -> list[PolicyFault]:
        """The policy faults since the last call (oldest first)."""
        out, self.faults = self.faults, []
        return out

    def take_cold(self) -> list[ModelName]:
        """The loadable models requested with no ready endpoint since the last call (each once)."""
        out, self.cold = self.cold, []
        return out

    def take_preemptions(self) -> list[Preempt]:
        """The preemptions made during `submit` calls since the last call (drivers drain it right after
        each submit; every other method returns its preemptions in its decision list)."""
        out, self.outbox = self.outbox, []
        return out

    @property
    def owed(self) -> bool:
        """Whether a call left serving to do (`Scheduler.serve` goes on with it)."""
        return bool(self._slices.owed)

    @property
    def loadable(self) -> frozenset[ModelName]:
        return self._loadable

    def known_models(self) -> frozenset[ModelName]:
        """The models a request may name: served by an endpoint (in any state) or loadable on demand.
        Kept until either set changes (admission asks on every request)."""
        served, loadable, known = self._known
        every = self._fleet.models(ready_only=False)
        if every is not served or self._loadable is not loadable:
            known = every | self._loadable
            self._known = (every, self._loadable, known)
        return known

    def lookahead(self, n: int) -> tuple[ModelName, ...]:
        """The models of the first `n` queued requests, in arrival order (every queue)."""
        items = sorted((q.seq, m) for m, queue in self._queues.items() for q in queue)
        return tuple(m for _, m in items[:n])

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def limits(self) -> QueueLimits:
        return self._limits

    # ----------------------------------------------------------------- views
    def snapshot(self) -> FleetSnapshot:
        now = self._clock.now()
        profile = self._policy.profile
        cols = None
        if profile.columnar and self._fleet.size() >= profile.columns_least:
            # placement over columns: the views' arrays come along
            cols = self._fleet.columns(now, self._limits.stale_after_s)
            views = cols.endpoints
        else:
            views = self._fleet.views(now, self._limits.stale_after_s)
        # the snapshots of the same views share what plugins derive from them (`FleetSnapshot.ready`);
        # a new tuple's memo carries the last one's over, brought up to date where entries were replaced
        memo = self._memo
        if memo is None or memo.endpoints is not views:
            memo = self._memo = ViewsMemo.of(views, memo, self._fleet.replaced())
        return FleetSnapshot(now, views, self._queues.waiting(), cols, memo)

    def queue_depth(self, model: ModelName) -> int:
        return self._queues.depth(model)

    def queue_depths(self) -> dict[ModelName, int]:
        return self._queues.depths()

    def progress(self, req_id: RequestId, produced: int, first_token_at: float | None) -> None:
        """A dispatched request has streamed `produced` tokens (its first at `first_token_at`): placement
        plugins see it in the endpoint's running requests. Serves nothing by itself."""
        self._fleet.progress(req_id, produced, first_token_at, self._clock.now())

    def progress_many(self, reports: Iterable[Progress]) -> None:
        """`progress` of each of `reports` in turn, each made at its own time (the fourth item, at most
        now): the same as the calls one by one at those times, in one call (the fleet simulator hands
        over the reports made between two of its events together)."""
        self._fleet.progress_many(reports)

    def pin(self, req_id: RequestId) -> None:
        """A running request can no longer be resumed faithfully (its stream produced reasoning or a
        tool call, which a continuation from text would lose): it is never chosen as a victim."""
        self._fleet.pin(req_id)

    def engine_priority(self, req_id: RequestId) -> int | None:
        """The priority to send with a dispatched request (lower is more urgent): set only when its
        endpoint runs priority scheduling and the policy's ordering has one."""
        return self._priorities.get(req_id)

    def running_on(self, req_id: RequestId) -> EndpointId | None:
        return self._fleet.running_on(req_id)

    def dispatched(self, req_id: RequestId) -> SchedRequest | None:
        """A running request as it was dispatched (None: not running on an endpoint of the set)."""
        return self._fleet.request(req_id)

    def inflight_on(self, eid: EndpointId) -> int:
        """Requests the gateway runs on `eid` now (0 for an unknown endpoint)."""
        return self._fleet.inflight_on(eid)

    def cap_of(self, eid: EndpointId) -> int | None:
        """The concurrency cap in force on `eid` (None: unknown endpoint); its view shows it as `cap`,
        and the configured maximum as `max_cap`."""
        return self._fleet.cap_of(eid)

    def endpoint_view(self, eid: EndpointId) -> EndpointView | None:
        return self._fleet.view(eid, self._clock.now(), self._limits.stale_after_s)

    def queued(self, model: ModelName) -> list[SchedRequest]:
        """The requests of `model` waiting in the gateway queue, in queue order (the autoscaler's view)."""
        return [item.req for item in self._queues.get(model) or ()]

    def queued_by_class(self) -> dict[ModelName, dict[str, int]]:
        """Queued requests per model and SLO class (for the admin API; counted as they come and go)."""
        return self._queues.by_class()

    def models(self, *, ready_only: bool) -> frozenset[ModelName]:
        """Models served by any endpoint (in any state), or only by ready ones."""
        return self._fleet.models(ready_only=ready_only)

    def endpoint_ids(self) -> list[EndpointId]:
        return self._fleet.ids()
