"""One Protocol per extension point. Each docstring is the contract; the runner enforces it.

Plugins are synchronous and side-effect free with respect to the fleet: they may keep private state
(a round-robin cursor, a seeded RNG) but never await, do I/O, or mutate the snapshot or request.

Every Protocol is runtime-checkable: a policy checks each plugin it builds against its extension
point's Protocol, and looks up the optional capabilities (`TieredFilter`, `ScopedFilter`,
`GroupingFilter`, `SureRejects`, `SetAsideFilter`, `ColumnarFewFilter`, `EnginePriority`) once, when it is
built, never per request.

A little over the size rule on purpose: every extension point's contract, with its optional
capabilities and their columnar forms, is read in one place.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from gateway.core.slo import SloKind
from gateway.core.types import EndpointId, InstanceClass, ModelName
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot

#: A key orders the queue: smaller keys are served first. Ties break by arrival order.
OrderKey = tuple[float, ...]


@runtime_checkable
class Ordering(Protocol):
    """Priority key of a queued request.

    Called whenever the queue is served, so a key may change as time passes (slack). Must return a
    tuple of finite floats. Must not mutate anything.

    Optional: an ordering whose key of a waiting request depends on the request alone, never on the time
    or the fleet, may say so with an attribute `stable_keys = True` (a class attribute, or an instance
    attribute set when it is built). The queue then asks each request's key once, when it joins (again
    when it is requeued or its request changes, e.g. a demotion), instead of every time the queue is
    served. Without the attribute keys are taken to move.
    """

    def key(self, req: SchedRequest, snap: FleetSnapshot) -> OrderKey: ...


#: A request's rank under a ranked ordering: (group, position); see `RankedOrdering`.
Rank = tuple[int, float]


class RankedQueue(Protocol):
    """A queue's requests by rank, as a ranked ordering reads them (`gateway.sched.ranked.RankIndex`)."""

    def first_from(self, group: int, at: float, skipped: AbstractSet[int]) -> tuple[float, int] | None:
        """(position, token) of the first request of `group` whose position is `at` or later (ties in
        arrival order), leaving out those whose seq is in `skipped`; None when there is none."""
        ...


class RankedOrdering(Ordering, Protocol):
    """An ordering that keeps its queue ranked instead of asking every key when the queue is served.

    Optional, declared with an attribute `ranks = True` (like `stable_keys`). Each queued request gets a
    rank, (group, position), that does not move with the clock: `rank` is asked when the request joins
    the queue, when its request changes, and for every queued request when `rank_epoch` for its model
    changes (the ordering's answer to "do the ranks still hold": e.g. the fleet's fitted models; must be
    cheap and comparable with ==). `rank` is only asked right after `rank_epoch` on the same snapshot.
    `pick` then chooses the request to serve from the ranked queue, in a few look-ups
    (`RankedQueue.first_from`): the token it returns, or None when every request is skipped. `key` stays
    the ordering's exact answer (the scan; engine priorities); a ranked pick may decide differently by
    design, which the ordering documents.
    """

    def rank_epoch(self, model: ModelName, snap: FleetSnapshot) -> Hashable: ...

    def rank(self, req: SchedRequest, snap: FleetSnapshot) -> Rank: ...

    def pick(
        self, queue: RankedQueue, model: ModelName, snap: FleetSnapshot, skipped: AbstractSet[int]
    ) -> int | None: ...


@runtime_checkable
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


@runtime_checkable
class TieredFilter(Filter, Protocol):
    """A filter that ranks the candidates in preference tiers instead of dropping some outright.

    The runner passes the first non-empty tier through the rest of the pipeline's filters, and the
    next tier only when nothing in the first survives them. Every tier is a subset of the candidates;
    an empty list of tiers means "nothing eligible now". `filter` must return the first non-empty tier
    (what the filter means on its own).
    """

    def tiers(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[Sequence[EndpointView]]: ...


@runtime_checkable
class ScopedFilter(Filter, Protocol):
    """A filter that keeps a request to a fixed part of its model's endpoints, whatever their load (e.g.
    the endpoint groups of `demand-split`).

    `scope` gets every endpoint serving the request's model (ready or not, with room or not) and returns
    those the request may ever be placed on now. Admission judges the request on these only, so it does
    not count seats the request could never take.
    """

    def scope(
        self, req: SchedRequest, serving: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]: ...


@runtime_checkable
class ColumnarScopedFilter(ScopedFilter, Protocol):
    """A scoped filter with a form over the fleet's columns: `scope` as a mask (the endpoints serving the
    model that it is given, as a mask in the columns' order, in; those `scope` would keep, out)."""

    def scope_columns(
        self, req: SchedRequest, cols: FleetColumns, serving: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]: ...


@runtime_checkable
class GroupingFilter(Filter, Protocol):
    """A filter that splits each model's endpoints into named groups (for the admin view).

    `groups` answers, for every group the filter defines, its share of the model's recent demand (None
    when the filter does not size by demand) and the endpoints it holds now (empty when the model's
    endpoints are not split)."""

    def groups(self, model: ModelName) -> dict[str, tuple[float | None, list[EndpointId]]]: ...


@runtime_checkable
class SureRejects(Protocol):
    """A filter (or a picker) that can name, cheaply, candidates it is sure never to keep (or pick), so
    that the filter before it in the pipeline leaves them out of its own costly judgement
    (`SetAsideFilter`). `sure_rejects` gives one flag per candidate, in their order (True: surely
    rejected; all False: none known). Contract: an endpoint is named on its own account, whatever the
    other candidates are, and dropping named endpoints from the plugin's candidates changes nothing it
    returns. The runner asks a picker only when the profile has no scorers (a scorer's values may
    depend on the whole candidate list)."""

    def sure_rejects(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[bool]: ...


@runtime_checkable
class SetAsideFilter(Filter, Protocol):
    """A filter that can be told which candidates the next plugin of the pipeline is sure to reject
    (`SureRejects`): `filter_aside(req, kept, aside, snap)` returns exactly what `filter` over both
    (`kept` and `aside` together, in the candidates' order) keeps of `kept`, judging `aside` only as
    far as that needs (a filter whose answer for one endpoint depends on the others, e.g. "those where
    the request meets its targets, or all where it harms no one when there are none", needs some). The
    runner sets aside what the next plugin names before calling this filter."""

    def filter_aside(
        self,
        req: SchedRequest,
        kept: Sequence[EndpointView],
        aside: Sequence[EndpointView],
        snap: FleetSnapshot,
    ) -> Sequence[EndpointView]: ...


@runtime_checkable
class Scorer(Protocol):
    """Scores each candidate in [0, 1], higher is better: a sequence of the candidates' scores in their
    order (as long as `candidates`: the runner raises otherwise), or a mapping by endpoint id (endpoints
    missing from it score 0). The sequence is the cheaper: the runner takes it as it is, where a
    mapping costs a dict built and a lookup per candidate (over 100 endpoints, about 7 µs of a
    request's 57 in the scheduler: `overhead_micro --pieces fleet_100`).

    The runner clamps out-of-range values and NaN to [0, 1] and multiplies by the profile's weight for
    this scorer; weights live in the policy, not the plugin.
    """

    name: str

    def score(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[float] | Mapping[EndpointId, float]: ...


@runtime_checkable
class Picker(Protocol):
    """Chooses one endpoint from non-empty scored candidates (weighted score sum, higher is better).

    Must return one of the given endpoints. The runner never calls it with an empty sequence.
    """

    name: str

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView: ...


@runtime_checkable
class ColumnarFilter(Filter, Protocol):
    """A filter with a form over the fleet's columns (`FleetColumns`): given the candidates as a mask in
    the columns' order, the mask of those `filter` would keep. A profile places over columns only when
    every one of its filters, scorers and its picker has such a form."""

    def filter_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]: ...


@runtime_checkable
class ColumnarFewFilter(ColumnarFilter, Protocol):
    """A columnar filter that may answer with the candidates it keeps as views instead of a mask: those
    of `filter_columns`' mask (a list, in any order), when it judged them one load at a time and they
    are few (their loads made, no arrays of them: the plain forms of the plugins after it cost less
    over them than their columnar forms). The runner then places the rest of the way over those views
    in the plain forms (the later filters, the scorers, the picker), the same choice as over the mask;
    given a mask, over columns as before."""

    def filter_columns_few(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_] | list[EndpointView]: ...


@runtime_checkable
class ColumnarTieredFilter(TieredFilter, Protocol):
    """A tiered filter with a form over the fleet's columns: `tiers` as masks in the columns' order (each
    a subset of the candidates' mask), the same tiers in the same order."""

    def tiers_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> Sequence[npt.NDArray[np.bool_]]: ...


@runtime_checkable
class ColumnarSureRejects(SureRejects, Protocol):
    """`SureRejects` over the fleet's columns: the mask (in the columns' order, a subset of the
    candidates') of the candidates `sure_rejects` would name."""

    def sure_rejects_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]: ...


@runtime_checkable
class ColumnarSetAsideFilter(SetAsideFilter, Protocol):
    """`SetAsideFilter` over the fleet's columns: `kept` and `aside` as disjoint masks, the mask of
    what `filter_columns` over both keeps of `kept`."""

    def filter_columns_aside(
        self,
        req: SchedRequest,
        cols: FleetColumns,
        kept: npt.NDArray[np.bool_],
        aside: npt.NDArray[np.bool_],
        snap: FleetSnapshot,
    ) -> npt.NDArray[np.bool_]: ...


@runtime_checkable
class ColumnarScorer(Scorer, Protocol):
    """A scorer with a form over the fleet's columns: every endpoint's score at once, in the columns'
    order (the values of non-candidates are ignored), each candidate's the value `score` gives it."""

    def score_columns(
        self, req: SchedRequest, cols: FleetColumns, snap: FleetSnapshot
    ) -> npt.NDArray[np.float64]: ...


@runtime_checkable
class ColumnarPicker(Picker, Protocol):
    """A picker with a form over the fleet's columns: the index (in the columns' order) of the endpoint
    `pick` would choose, among the candidates (a mask with at least one) with these weighted scores."""

    def pick_columns(
        self,
        req: SchedRequest,
        cols: FleetColumns,
        candidates: npt.NDArray[np.bool_],
        scores: npt.NDArray[np.float64],
        snap: FleetSnapshot,
    ) -> int: ...


class AdmitOutcome(enum.StrEnum):
    ADMIT = "admit"  # its SLO looks feasible (or it has none): queue it
    HOLD = "hold"  # infeasible now, its class says queue it anyway
    BEST_EFFORT = "best_effort"  # infeasible, demoted to the lowest band
    REJECT = "reject"  # answered 429 now


@dataclass(frozen=True, slots=True)
class AdmitDecision:
    outcome: AdmitOutcome
    reason: str = ""  # machine-readable (the error code of a rejection): slo_infeasible, class_queue_full
    message: str = ""  # for the client
    retry_after_s: float | None = None  # a rejection's Retry-After


ADMIT: AdmitDecision = AdmitDecision(AdmitOutcome.ADMIT)


@runtime_checkable
class Admitter(Protocol):
    """Decides once, when a request arrives and before it is queued, whether it may wait for a place.

    `queued_in_class(name)` counts the requests of SLO class `name` already waiting for the same model.
    Returns a decision; REJECT must carry a `reason` (it becomes the 429's error code). Must not mutate
    anything. Retries of an admitted request are not asked again.
    """

    name: str
    # Whether `recheck` can answer anything but ADMIT (False: the scheduler does not ask it on ticks).
    rechecks: bool

    def admit(
        self, req: SchedRequest, snap: FleetSnapshot, queued_in_class: Callable[[str], int]
    ) -> AdmitDecision: ...

    def recheck(self, req: SchedRequest, snap: FleetSnapshot) -> AdmitDecision:
        """Called for every queued request on each scheduler tick: REJECT drops it with a 429 (its
        SLO became infeasible while it waited), BEST_EFFORT demotes it; ADMIT and HOLD leave it."""
        ...


@runtime_checkable
class RecheckFrom(Admitter, Protocol):
    """An admitter that can say how long its recheck of a queued request is sure to admit it, so a tick
    need not ask it until then (`gateway.sched.checks`).

    `recheck_from(req, snap)`: a clock time before which `recheck` answers ADMIT for `req` on `snap`
    and on any snapshot of the same fleet at a later time, whatever part of it a scoped filter leaves
    (−inf: ask on every tick; +inf: never refuses it), for as long as `recheck_epoch(model, snap)` for
    its model stays equal. Asked once per queued request and epoch, after the epoch on the same snapshot.

    `recheck_next(req, snap)`: the same promise for a request whose `recheck_from` time has come and
    that `recheck` just kept on `snap` (usually a later time: a tighter bound), for as long as
    `recheck_next_epoch(model, snap)` stays equal (it may change where `recheck_epoch` does not). Asked
    once per request a tick kept, after that epoch on the same snapshot.
    """

    def recheck_epoch(self, model: ModelName, snap: FleetSnapshot) -> Hashable: ...

    def recheck_from(self, req: SchedRequest, snap: FleetSnapshot) -> float: ...

    def recheck_next_epoch(self, model: ModelName, snap: FleetSnapshot) -> Hashable: ...

    def recheck_next(self, req: SchedRequest, snap: FleetSnapshot) -> float: ...


@runtime_checkable
class Waiting(Protocol):
    """An admitter that prepares for the requests it let in that wait in the queue: told once per such
    request, as it is queued on arrival (a request placed at once, most below saturation, never waits,
    and costs the admitter nothing more)."""

    def waiting(self, req: SchedRequest) -> None: ...


@runtime_checkable
class EnginePriority(Protocol):
    """An ordering that also tells an engine with priority scheduling how urgent a request is.

    Returns a small integer, lower is more urgent (vLLM's convention; the dialect converts for SGLang),
    or None for "send no priority". Called once, when the request is dispatched to such an endpoint.
    """

    def engine_priority(self, req: SchedRequest, snap: FleetSnapshot) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Victim:
    """A running request that may be preempted, and the endpoint whose seat it holds."""

    running: RunningRequest
    endpoint: EndpointView


@dataclass(frozen=True, slots=True)
class PreemptionRules:
    """Which requests may preempt which, and where (a preemption plugin's common parameters; the
    scheduler enforces them, whatever the plugin ranks)."""

    by: frozenset[SloKind] = frozenset({SloKind.INTERACTIVE})  # kinds whose requests may preempt
    victims: frozenset[SloKind] = frozenset({SloKind.BATCH})  # kinds whose requests may be preempted
    classes: frozenset[InstanceClass] = frozenset({InstanceClass.MIXED})  # on endpoints of these classes
    max_preemptions: int = 1  # a request preempted this often is never a victim again
    # Victims preempted at most on one endpoint for one request (more than one when one seat is not
    # enough: e.g. the overflow guard admits an interactive stream only once the batch is smaller).
    max_victims: int = 1
    # The wait a victim is assumed to have in the queue before it runs again, for the check that its own
    # SLO stays feasible (its deadline, its average inter-token time).
    requeue_wait_s: float = 10.0
    margin: float = 1.0  # < 1 demands room to spare in that check
    # Endpoint classes in the order their victims are tried (the preemptor's order within a class);
    # empty: the preemptor's order across every allowed class.
    class_order: tuple[InstanceClass, ...] = ()


@runtime_checkable
class Preemptor(Protocol):
    """Chooses which running request gives its seat to a request that could not be placed.

    `victims` are the running requests the scheduler already found eligible (resumable, of a kind that
    may be preempted, under the policy's preemption limit, on an endpoint of an allowed class, their own
    SLO still feasible after a resume). Returns them best first; it may leave some out (never add one).
    An empty result means "preempt nothing": the request stays queued. The scheduler takes the first
    victims whose seats make room for the request on one endpoint (the placement filters accept it there
    once they are gone; see `PreemptionRules.max_victims`). Must not mutate anything.
    """

    name: str
    rules: PreemptionRules

    def rank(self, req: SchedRequest, victims: Sequence[Victim], snap: FleetSnapshot) -> Sequence[Victim]: ...


@runtime_checkable
class ConcurrencyController(Protocol):
    """Sets an endpoint's concurrency cap (the seats `EndpointView.has_room` counts), e.g. Chiron's local
    autoscaler.

    Called when the requests running on an endpoint changed (a dispatch, a completion, a preemption),
    with the endpoint's view as of now (`view.cap` is the cap in force; `view.max_cap` the operator's
    hard maximum). Returns the cap to enforce from now; the scheduler clamps it into
    [`floor`, `view.max_cap`], so a plugin never lifts a cap past the operator's. A lowered cap takes
    no seat from a running request: it only stops new ones until enough finish. May keep private state
    per endpoint (the previous throughput, the time of its last change); must not mutate the view.
    """

    name: str
    floor: int  # the smallest cap it may set (>= 1)

    def cap(self, view: EndpointView, now: float) -> int: ...
