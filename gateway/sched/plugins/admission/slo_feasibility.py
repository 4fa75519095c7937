"""Admission by predicted feasibility: a request whose SLO no endpoint of its model can meet (predicted,
as if it were dispatched now) gets its class's `on_infeasible` outcome:

- `reject`: 429 now, error code `slo_infeasible`, Retry-After = the smallest predicted wait for a seat
  (at least `retry_after_s`);
- `hold`: queued anyway (the ordering decides when it runs);
- `best-effort`: queued, demoted below every band (it runs when nothing with a chance is waiting).

(Over 450 lines: one admitter asks its one question four ways, on arrival, after the requests ahead,
surely from bounds, and again while a request waits; what each way computes already stands apart, in
`seat_order`, `seat_bound`, `ready`, `preempted` and `speeds`.)

A request is feasible on an endpoint when its predicted first and last token keep its deadlines within
`margin` (1.2: up to 20 % over still counts as feasible, for prediction error) and its per-token time
keeps its ITL target. With `count_queue`, the requests already waiting for the model in classes of the
same or a more urgent band go first: when they take every free seat, the request waits for the seat
that frees after theirs (the running requests' predicted ends, in order), then runs in a full batch.
Under a policy that preempts, a request of a kind that may preempt also counts the seats preemption
would free (`gateway.sched.plugins.admission.preempted`: running requests its rules let it preempt),
on arrival and in the "infeasible" recheck, so it is not refused while preempting batch work would let
it keep its SLO ("late" judges a request alone on an endpoint: preemption changes nothing there).
Every admitter also enforces the class queue bounds. While no endpoint of its model has a fitted
performance model or a configured prior, a request is refused (`reject`) only when it cannot meet its
SLO even alone on an idle endpoint: the generic prior is a guess about other hardware, and a refusal on
its view of the load would turn away work the fleet may well serve (day one, before the fits have data).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from itertools import chain
from operator import attrgetter
from typing import Annotated, Final, Literal

from msgspec import Meta

from gateway.core.slo import Infeasible, SloPolicy
from gateway.core.types import EndpointHealth, ModelName, RequestId
from gateway.sched.idle import IdleBound, IdleTerms, KeptBounds, output_bound
from gateway.sched.interfaces import ADMIT, AdmitDecision, AdmitOutcome, PreemptionRules
from gateway.sched.load_batch import Pending
from gateway.sched.loads import LoadCache, LoadCaches
from gateway.sched.memo import make_room
from gateway.sched.perf import default_prior
from gateway.sched.plugins.admission.common import SLO_INFEASIBLE, class_bound
from gateway.sched.plugins.admission.free_seat import Limits, Missed, misses_everywhere
from gateway.sched.plugins.admission.preempted import PreemptedSeats
from gateway.sched.plugins.admission.ready import ReadySeats
from gateway.sched.plugins.admission.seat_bound import SureAdmission
from gateway.sched.plugins.admission.seat_order import SEAT_ENDS_FROM, SeatOrder
from gateway.sched.plugins.admission.speeds import ReadySpeeds
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.predict import EndpointLoad, Prediction, idle_service
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot
from gateway.sched.targets import meets, time_left

#: Headroom of a new recheck bound over the slowest coefficients (refits that slow an endpoint by less
#: keep it), and the time a request's recheck comes before its exact latest start (float rounding).
_BOUND_HEADROOM: Final = 0.05
_EPSILON_S: Final = 1e-6
_PRIOR: Final = default_prior()
#: Relative float rounding a bound's times may differ by from an endpoint's own (the sums are associated
#: differently); a request is judged late everywhere from the bound only beyond it.
_ROUNDING: Final = 1e-9

_RUNNING: Final = attrgetter("n")  # a load's running requests (`EndpointLoad`, `Pending`)
_TERMS_KEPT: Final = 1 << 15  # requests whose `IdleTerms` the recheck keeps at most (then made afresh)

_OUTCOME = {
    Infeasible.REJECT: AdmitOutcome.REJECT,
    Infeasible.HOLD: AdmitOutcome.HOLD,
    Infeasible.BEST_EFFORT: AdmitOutcome.BEST_EFFORT,
}


class SloFeasibilityParams(PredictionParams, frozen=True, kw_only=True):
    margin: Annotated[float, Meta(ge=0.5, le=10.0)] = 1.0
    retry_after_s: Annotated[float, Meta(ge=0.0)] = 1.0
    count_queue: bool = True  # wait behind the queued requests of the same or a more urgent band
    # Decode at a full batch (every seat taken), not the batch it would join now: under load the
    # batch fills up while a long request runs.
    assume_full: bool = False
    # While a request waits in the queue, on every tick: "late" gives it its class's outcome once it
    # cannot meet its SLO even alone on the best endpoint (running it would waste the capacity);
    # "infeasible" as soon as no endpoint could meet it if it were dispatched now (the arrival check
    # again, without the queue); "off" decides on arrival only.
    recheck: Literal["off", "late", "infeasible"] = "late"


class SloFeasibilityAdmitter:
    name = "slo-feasibility"

    def __init__(
        self,
        params: SloFeasibilityParams,
        slo: SloPolicy,
        loads: LoadCache | None = None,
        *,
        preemption: PreemptionRules | None = None,
        caches: LoadCaches | None = None,
    ) -> None:
        """`preemption`: the policy's preemption rules (None: it never preempts), whose victims' loads
        come from `caches` (the policy's shared loads)."""
        self.rechecks = params.recheck != "off"
        self._late = params.recheck == "late"
        self._bounds: dict[ModelName, IdleBound | None] = {}  # per model: the recheck bound in force
        self._next_bounds: dict[ModelName, IdleBound | None] = {}  # the same without headroom
        self._fleet_bounds = KeptBounds()
        self.params = params
        self._slo = slo
        self._cache = loads or LoadCache(params.predict_params())
        # the ready endpoints fastest first and their fastest bound, per views (by identity) and model
        self._speeds = ReadySpeeds(self._fleet_bounds)
        self._terms: dict[RequestId, tuple[SchedRequest, IdleTerms]] = {}  # per request (`_terms_of`)
        self._outcomes: dict[str, AdmitDecision] = {}  # a recheck's refusal per SLO class (`_outcome`)
        # per band: the classes of that band or a more urgent one (`_ahead`), in the policy's order
        self._ahead_of: dict[int, tuple[str, ...]] = {}
        # The seat order (`SeatOrder`) of the last loads asked about.
        self._frees: SeatOrder | None = None
        self.seat_ends_from = SEAT_ENDS_FROM  # pending loads whose ends are derived as arrays (`SeatOrder`)
        # A request surely admitted at the k-th seat without the seat order (`seat_bound`; None: never).
        self._sure: SureAdmission | None = SureAdmission()
        # The ready endpoints of the last snapshot's views and model, and their free seats in all.
        self._readied: ReadySeats | None = None
        self._preempted = (
            None if preemption is None else PreemptedSeats(preemption, slo, caches or LoadCaches())
        )

    def waiting(self, req: SchedRequest) -> None:
        """`req`, let in on arrival, is queued to wait (`Waiting`): the idle terms the late recheck asks
        for on the ticks it waits through are made now (the tick that first schedules its recheck then
        only reads them). A request placed at once needs none."""
        if self._late and not req.best_effort:
            self._terms_of(req)

    def admit(
        self, req: SchedRequest, snap: FleetSnapshot, queued_in_class: Callable[[str], int]
    ) -> AdmitDecision:
        bound = class_bound(self._slo, req, queued_in_class, self.params.retry_after_s)
        if bound is not None:
            return bound
        left = time_left(req, snap.now)
        itl_ms = req.slo.itl_ms
        if left == (None, None) and itl_ms is None:
            return ADMIT
        kept = self._ready_and_free(req.model, snap)
        if not kept.any:
            return ADMIT  # nothing ready: the scheduler answers for that
        ahead = self._ahead(req, queued_in_class)
        # the loads the request missed on with a free seat, in order, and its times there (they come
        # first in a refusal's message)
        missed: Missed | None = None
        preds: list[Prediction] = []
        if ahead < kept.free:
            # A seat is free for it: admitted once one endpoint with a free seat meets its SLO, so the
            # loads are derived (and the request predicted) one endpoint at a time until one does.
            full = self.params.assume_full
            tried = misses_everywhere(
                self._cache.each(kept.open(), snap.now), req, self._limits(left, itl_ms), worst_case=full
            )
            if tried is None:
                return ADMIT
            missed = tried  # (their times are read only for a refusal's message)
            loads = self._cache.refs(kept.views(), snap.now, keep=True)
        else:
            # Every free seat goes to the requests ahead: it waits for the (ahead - free)-th seat to free
            # up. Most such requests are shown surely admitted from bounds (`seat_bound`); otherwise the
            # loads to be made are derived together (their ends only, as arrays), and the one endpoint
            # it would wait on is made.
            loads = self._cache.refs(kept.views(), snap.now, keep=True)
            k = ahead - kept.free
            # (with more seats ahead than running requests, no seat frees for it: `_after`'s answer)
            if k < sum(map(_RUNNING, loads)):
                if self._surely(req, loads, k, snap, left=left, itl_ms=itl_ms):
                    # (the last seat order is let go: its loads, older by now, would hold their views'
                    # records, and the next order asked for is made from the loads of then)
                    self._frees = None
                    return ADMIT
                preds = self._after(req, loads, k)
                if any(self._meets(p, left, itl_ms) for p in preds):
                    return ADMIT
        views = kept.views()
        if self._preempted is not None:
            # the seats preemption would free: those left once the requests ahead took the free ones
            more = self._preempted.predictions(
                req,
                views,
                loads,
                snap.now,
                max(0, ahead - kept.free),
                worst_case=self.params.assume_full,
            )
            if any(self._meets(p, left, itl_ms) for p in more):
                return ADMIT
            preds += more
        outcome = _OUTCOME[self._slo.class_of(req.slo.slo_class).on_infeasible]
        if (
            outcome is AdmitOutcome.REJECT
            and all((e.perf or _PRIOR) == _PRIOR for e in views)
            and any(meets(idle_service(e, req, self._cache.params), left) for e in views)
        ):
            # No endpoint's model is fitted yet (nor a prior set): its view of the load is a guess, so
            # no refusal on it; only what cannot be met even alone on an idle endpoint is refused.
            return ADMIT
        if outcome is not AdmitOutcome.REJECT:
            return AdmitDecision(outcome, SLO_INFEASIBLE)
        ttft_left, e2e_left = left
        # (the minima over the free-seat predictions, then the others, in the order they were made)
        ttfts: Sequence[float] = ()
        e2es: Sequence[float] = ()
        waits: Sequence[float] = ()
        if missed is not None:
            ttfts, e2es, waits = missed.ttfts, missed.e2es, [load.wait_s for load in missed.loads]
        parts = []
        if ttft_left is not None:
            best = min(chain(ttfts, (p.ttft_s for p in preds)), default=math.inf)
            parts.append(f"first token predicted in {best * 1000:.0f} ms, {ttft_left * 1000:.0f} ms left")
        if e2e_left is not None:
            best = min(chain(e2es, (p.e2e_s for p in preds)), default=math.inf)
            parts.append(f"completion predicted in {best * 1000:.0f} ms, {e2e_left * 1000:.0f} ms left")
        if itl_ms is not None and not parts:
            parts.append(f"no endpoint keeps the {itl_ms:g} ms inter-token target")
        wait = min(chain(waits, (p.wait_s for p in preds)), default=0.0)
        retry = max(self.params.retry_after_s, wait if math.isfinite(wait) else 0.0)
        return AdmitDecision(
            AdmitOutcome.REJECT,
            SLO_INFEASIBLE,
            f"no endpoint of model '{req.model}' can meet the SLO of class '{req.slo.slo_class}' now: "
            + "; ".join(parts),
            retry,
        )

    def _ready(self, req: SchedRequest, snap: FleetSnapshot) -> list[EndpointView]:
        """Every ready endpoint serving the request's model."""
        model, ready = req.model, EndpointHealth.READY
        return [e for e in snap.endpoints if model in e.models and e.health is ready]

    def _ready_and_free(self, model: ModelName, snap: FleetSnapshot) -> ReadySeats:
        """`_ready` and their free seats in all, kept for the snapshot's views (the submits between two
        changes of the fleet ask about the same views); from the columns when the snapshot carries
        them (a large fleet: no Python step per endpoint)."""
        kept = self._readied
        if kept is not None and kept.endpoints is snap.endpoints and kept.model == model:
            return kept
        kept = self._readied = ReadySeats(model, snap)
        return kept

    def _terms_of(self, req: SchedRequest) -> IdleTerms:
        """`IdleTerms` of `req`, kept per request (a queued request is asked about on many ticks: its due
        time, its recheck, the next one)."""
        got = self._terms.get(req.id)
        if got is not None and got[0] is req:
            return got[1]
        # requests come and go: the oldest forgotten a few at a time (emptied whole, 32,768 requests
        # would be freed inside one call)
        make_room(self._terms, _TERMS_KEPT)
        made = IdleTerms.of(req, self._cache.params.gamma)
        self._terms[req.id] = (req, made)
        return made

    def _late_everywhere(
        self,
        req: SchedRequest,
        terms: IdleTerms,
        bound: IdleBound | None,
        left: tuple[float | None, float | None],
    ) -> bool:
        """Whether `req` (its `terms`) misses a deadline alone even at `bound`, the fastest coefficients
        of the model's ready endpoints (`IdleBound`, the per-coefficient minimum: no endpoint is faster),
        by more than float rounding: then it misses it alone on every endpoint, and they need not be
        asked one by one. False when a cached prefix makes the prefill differ by endpoint (each is
        asked)."""
        if bound is None or req.cached:
            return False
        ttft, e2e = bound.times(terms.prompt, terms.out, 1.0 + self._cache.params.prefill_overhead)
        ttft_left, e2e_left = left
        return (ttft_left is not None and ttft > ttft_left + _ROUNDING * abs(ttft_left)) or (
            e2e_left is not None and e2e > e2e_left + _ROUNDING * abs(e2e_left)
        )

    def recheck(self, req: SchedRequest, snap: FleetSnapshot) -> AdmitDecision:
        """A queued request that cannot meet its SLO even alone on the best endpoint gets its class's
        outcome (reject: 429 slo_infeasible; best-effort: demoted; hold: nothing)."""
        mode = self.params.recheck
        if mode == "off" or req.best_effort:
            return ADMIT
        if mode == "late":
            terms = self._terms_of(req)
            left = terms.left(snap.now)
            if left == (None, None):
                return ADMIT
            _, ready, fastest = self._speeds.of(req.model, snap)
            if not ready:
                return ADMIT
            # alone on an endpoint: its coefficients suffice, no load is derived; the fastest endpoints
            # first, as the one that keeps its deadlines is most likely among them
            params = self._cache.params
            if not self._late_everywhere(req, terms, fastest, left) and any(
                meets(idle_service(e, req, params), left) for e in ready
            ):
                return ADMIT
            return self._outcome(req)
        left = time_left(req, snap.now)
        if left == (None, None):
            return ADMIT
        ready = self._ready(req, snap)
        if not ready:
            return ADMIT
        if self._feasible_now(req, ready, snap.now, left):
            return ADMIT
        return self._outcome(req)

    def _outcome(self, req: SchedRequest) -> AdmitDecision:
        """A recheck's answer for a queued request that can no longer meet its SLO: its class's (one
        answer per class, kept: a tick refuses tens of requests of a few classes)."""
        cls = req.slo.slo_class
        got = self._outcomes.get(cls)
        if got is None:
            got = self._outcomes[cls] = AdmitDecision(
                _OUTCOME[self._slo.class_of(cls).on_infeasible],
                SLO_INFEASIBLE,
                f"the SLO of class '{cls}' can no longer be met: the request waited too long",
                self.params.retry_after_s,
            )
        return got

    def _feasible_now(
        self,
        req: SchedRequest,
        ready: list[EndpointView],
        now: float,
        left: tuple[float | None, float | None],
    ) -> bool:
        """Whether some endpoint of `ready` would meet `req`'s SLO if it were dispatched now (on a free
        seat, else the first to free up, or one preemption would free)."""
        loads = [self._cache.load(e, now) for e in ready]
        itl_ms = req.slo.itl_ms
        if any(self._meets(p, left, itl_ms) for p in self._predictions(req, loads, 0)):
            return True
        if self._preempted is None:
            return False
        more = self._preempted.predictions(req, ready, loads, now, 0, worst_case=self.params.assume_full)
        return any(self._meets(p, left, itl_ms) for p in more)

    def recheck_epoch(self, model: ModelName, snap: FleetSnapshot) -> Hashable:
        """In "late" mode, an upper bound on the idle service of every ready endpoint of `model`
        (`gateway.sched.idle`, the slowest coefficients with some headroom), kept while it still bounds
        them; in the other modes nothing (every request is rechecked on every tick)."""
        if self.params.recheck != "late":
            return None
        bound = self._fleet_bounds.bound(snap, model, slowest=True)
        kept = self._bounds.get(model)
        if kept is not None and bound is not None and bound.within(kept):
            return kept
        if bound is not None:
            bound = bound.scaled(1.0 + _BOUND_HEADROOM)
        self._bounds[model] = bound
        return bound

    def recheck_from(self, req: SchedRequest, snap: FleetSnapshot) -> float:
        """Before this time "late" cannot refuse `req`: even at the slowest coefficients of the model's
        ready endpoints it keeps its deadlines alone on an idle endpoint, so every endpoint does."""
        return self._start_before(req, self._bounds.get(req.model))

    def recheck_next_epoch(self, model: ModelName, snap: FleetSnapshot) -> Hashable:
        """In "late" mode, the slowest coefficients of the ready endpoints of `model` without headroom
        (a request whose time came at `recheck_epoch`'s bound waits for this one's), kept while they
        still bound them; in the other modes nothing."""
        if self.params.recheck != "late":
            return None
        bound = self._fleet_bounds.bound(snap, model, slowest=True)
        kept = self._next_bounds.get(model)
        if kept is not None and bound is not None and bound.within(kept):
            return kept
        self._next_bounds[model] = bound
        return bound

    def recheck_next(self, req: SchedRequest, snap: FleetSnapshot) -> float:
        """`recheck_from` at the bound of `recheck_next_epoch`: a request kept once its time at the
        bound with headroom came is next looked at when even the slowest endpoint would make it late
        (within a homogeneous fleet, the tick that refuses it), not on every tick until then."""
        return self._start_before(req, self._next_bounds.get(req.model))

    def _start_before(self, req: SchedRequest, bound: IdleBound | None) -> float:
        """The time before which "late" admits `req` while every ready endpoint's coefficients are within
        `bound` (its latest start there, less float rounding)."""
        if self.params.recheck == "off" or req.best_effort:
            return math.inf
        if self.params.recheck != "late":
            return -math.inf
        if bound is None:
            return -math.inf
        at = self._terms_of(req).latest_start(bound, 1.0 + self._cache.params.prefill_overhead)
        return math.inf if at is None else at - _EPSILON_S

    def _ahead(self, req: SchedRequest, queued_in_class: Callable[[str], int]) -> int:
        """Requests waiting for the model that will (roughly) run first: those of classes in the same
        or a more urgent band."""
        if not self.params.count_queue:
            return 0
        band = self._slo.class_of(req.slo.slo_class).band
        names = self._ahead_of.get(band)
        if names is None:
            names = self._ahead_of[band] = tuple(c.name for c in self._slo.classes.values() if c.band <= band)
        total = 0
        for name in names:
            total += queued_in_class(name)
        return total

    def _predictions(self, req: SchedRequest, loads: list[EndpointLoad], ahead: int) -> list[Prediction]:
        """The request on every endpoint with a free seat once `ahead` queued requests took theirs; when
        none is left, on the endpoint where the seat it would get frees (the ahead-th to free up)."""
        free = sum(max(0, load.seats - load.n) for load in loads)
        if ahead < free:
            full = self.params.assume_full
            return [load.predict(req, worst_case=full) for load in loads if load.n < load.seats]
        return self._after(req, loads, ahead - free)

    def _after(self, req: SchedRequest, loads: Sequence[EndpointLoad | Pending], k: int) -> list[Prediction]:
        """The request on the endpoint where the `k`-th (from 0) seat to free up frees, from then on
        (none: further out than every running request, infeasible)."""
        if k >= sum(map(_RUNNING, loads)):
            return []  # fewer running requests than seats ahead: none of their ends is needed
        order = self._frees
        # the last order renewed: only the loads remade since have their ends replaced
        order = self._frees = SeatOrder(loads, self.seat_ends_from) if order is None else order.renewed(loads)
        got = order.kth(k)
        if got is None:
            return []
        t, i = got
        load = loads[i]
        made = load.load() if isinstance(load, Pending) else load
        return [made.predict_after(req, t)]

    def _surely(
        self,
        req: SchedRequest,
        loads: Sequence[EndpointLoad | Pending],
        k: int,
        snap: FleetSnapshot,
        *,
        left: tuple[float | None, float | None],
        itl_ms: float | None,
    ) -> bool:
        """Whether `req` surely meets its SLO at the `k`-th seat to free up over `loads` (`_after`'s
        prediction), shown without deriving the loads remade since the last seat order (`seat_bound`)."""
        sure = self._sure
        if sure is None:
            return False
        limits = self._limits(left, itl_ms)
        model = req.model
        bounds = (
            self._fleet_bounds.bound(snap, model, slowest=True),
            self._fleet_bounds.bound(snap, model, slowest=False),
        )
        out = output_bound(req, self._cache.params.gamma)
        return sure.admits(req, loads, k, order=self._frees, bounds=bounds, limits=limits, out=out)

    def _limits(self, left: tuple[float | None, float | None], itl_ms: float | None) -> Limits:
        """The first-token, last-token and per-token limits `_meets` holds a prediction to."""
        m = self.params.margin
        ttft_left, e2e_left = left
        return (
            None if ttft_left is None else ttft_left * m,
            None if e2e_left is None else e2e_left * m,
            None if itl_ms is None else itl_ms * m,
        )

    def _meets(self, p: Prediction, left: tuple[float | None, float | None], itl_ms: float | None) -> bool:
        m = self.params.margin
        ttft_left, e2e_left = left
        return (
            (ttft_left is None or p.ttft_s <= ttft_left * m)
            and (e2e_left is None or p.e2e_s <= e2e_left * m)
            and (itl_ms is None or p.tpot_s * 1000.0 <= itl_ms * m)
        )


SPEC = PluginSpec(
    PluginKind.ADMITTER,
    "slo-feasibility",
    SloFeasibilityParams,
    lambda p, ctx: SloFeasibilityAdmitter(
        p, ctx.slo, ctx.loads.get(p.predict_params()), preemption=ctx.preemption, caches=ctx.loads
    ),
    "reject, hold or demote requests whose SLO no endpoint can meet (per class)",
)
