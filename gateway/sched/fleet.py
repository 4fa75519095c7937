"""The fleet as the scheduler holds it: each endpoint's runtime state, the requests running on it, the
views plugins see, and the sets of models served.

Every placement decides on a fresh `FleetSnapshot`, but an endpoint's view is rebuilt only when that
endpoint changed (or its engine gauges went stale): a placement on a large fleet does not remake the
views of the endpoints it did not touch. The model sets are likewise kept until an endpoint, its
health or its models change.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Final

from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, ModelName, RequestId
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest, resume_prompt_tokens, running_from, with_progress
from gateway.sched.snapshot import EndpointEstimates, EndpointView
from gateway.sched.types import EndpointSpec


class _Views:
    """The tuple of every endpoint's view, kept until one's gauges go stale; an endpoint that changed
    has its own entry replaced (`dirty`), so a dispatch on a large fleet does not walk every endpoint."""

    __slots__ = ("dirty", "endpoints", "fresh_until")

    def __init__(self) -> None:
        self.endpoints: tuple[EndpointView, ...] | None = None  # None: remade whole on next use
        self.fresh_until = math.inf  # clock time when the first kept view's gauges go stale (or earlier)
        self.dirty: list[_Endpoint] = []  # endpoints whose entry in `endpoints` is out of date


# Rebuild the views this long before a gauge's exact staleness time: the exact test is `now - scraped_at
# > stale_after_s`, and `scraped_at + stale_after_s` may round differently.
_STALE_MARGIN_S: Final = 1e-6


class _Endpoint:
    """The runtime state of one endpoint. Whoever changes a field calls `changed()` (the view is kept)."""

    __slots__ = (
        "_fleet",
        "_view",
        "_view_has_gauges",
        "cap",
        "completed_since_scrape",
        "cut_at",
        "dispatched_since_scrape",
        "estimates",
        "fresh_until",
        "gap_after_cut_s",
        "gap_after_cut_tokens",
        "gap_s",
        "gap_tokens",
        "gauges",
        "health",
        "index",
        "inflight",
        "models",
        "running",
        "running_output_tokens",
        "running_prompt_tokens",
        "scraped_at",
        "seats",
        "spec",
        "streamed_tokens",
    )

    def __init__(self, spec: EndpointSpec, fleet: _Views) -> None:
        self._fleet = fleet
        self.spec = spec
        # The engine's batch size its gauges showed (`Fleet.observe_gauges`); None: not seen yet.
        self.seats: int | None = None
        self.cap = self.bound  # the cap in force (a ConcurrencyController moves it within the bound)
        self.streamed_tokens = 0
        self.gap_s = 0.0
        self.gap_tokens = 0
        # When the cap in force was last lowered, and the gaps (as gap_s/gap_tokens) that began after it.
        self.cut_at = -math.inf
        self.gap_after_cut_s = 0.0
        self.gap_after_cut_tokens = 0
        self.models: frozenset[ModelName] = spec.models
        self.health = EndpointHealth.STARTING
        self.inflight = 0
        self.gauges: EngineGauges | None = None
        self.scraped_at: float | None = None
        self.dispatched_since_scrape = 0
        self.completed_since_scrape = 0
        self.running_prompt_tokens = 0
        self.running_output_tokens = 0.0
        self.estimates: EndpointEstimates | None = None
        self.running: dict[RequestId, RunningRequest] = {}  # what the gateway runs here, by dispatch
        self._view: EndpointView | None = None
        self.index = 0  # its place in the fleet's tuple of views (set by `Fleet.sync`)
        self._view_has_gauges = False
        self.fresh_until = math.inf  # when the kept view's gauges go stale (inf: it shows none)

    @property
    def bound(self) -> int:
        """The hard maximum of the cap: the operator's, else the max batch its instance configuration
        gives the engine (berth holds what the engine would only queue), else one more than the engine's
        batch size seen in its gauges (`Fleet._learn_seats`), else the default cap."""
        s = self.spec
        if s.cap is not None:
            return s.cap
        if s.max_batch is not None:
            return s.max_batch
        return s.default_cap if self.seats is None else self.seats + 1

    def changed(self) -> None:
        if self._view is not None:  # else it is in the fleet's dirty list already, or never was viewed
            self._view = None
            self._fleet.dirty.append(self)

    def view(self, now: float, stale_after_s: float) -> EndpointView:
        """The view as of `now`: the kept one unless the endpoint changed or its gauges went stale."""
        v = self._view
        if v is not None and not (self._view_has_gauges and self._stale(now, stale_after_s)):
            return v
        g = None if self._stale(now, stale_after_s) else self.gauges
        s = self.spec
        # Positional, in field order: a call with 29 keywords spends about 1 µs matching them to the
        # parameters, and a view is remade on every dispatch and completion.
        v = self._view = EndpointView(
            s.id,
            s.url,
            s.engine,
            self.models,
            s.instance_class,
            self.health,
            self.cap,
            self.inflight,
            None if g is None else g.running,  # engine_running
            None if g is None else g.waiting,  # engine_waiting
            None if g is None else g.kv_usage,  # kv_usage
            self.dispatched_since_scrape,
            self.scraped_at,
            s.node,
            self.completed_since_scrape,
            self.running_prompt_tokens,
            self.running_output_tokens,
            self.estimates,
            tuple(self.running.values()),  # running
            s.priority_scheduling,
            self.bound,  # max_cap
            self.streamed_tokens,
            self.gap_s,
            self.gap_tokens,
            self.cut_at,
            self.gap_after_cut_s,
            self.gap_after_cut_tokens,
            s.max_batch,
            s.config,
        )
        self._view_has_gauges = g is not None
        self.fresh_until = (
            math.inf if self.scraped_at is None or g is None else self.scraped_at + stale_after_s
        )
        return v

    def _stale(self, now: float, stale_after_s: float) -> bool:
        return self.scraped_at is None or now - self.scraped_at > stale_after_s


_NO_MODELS: Final[frozenset[ModelName]] = frozenset()
_INF: Final = math.inf


class Fleet:
    """Every endpoint's state and the requests dispatched to them. Changes come from the scheduler's
    events; the methods that answer a bool say whether anything changed (the queues may then move)."""

    __slots__ = ("_context", "_endpoints", "_model_sets", "_requests", "_running", "_views")

    def __init__(self) -> None:
        self._endpoints: dict[EndpointId, _Endpoint] = {}
        self._views = _Views()
        self._running: dict[RequestId, EndpointId] = {}
        self._requests: dict[RequestId, SchedRequest] = {}  # each running request as it was dispatched
        # Prompt and predicted output tokens of each running request (the endpoints' running-context sums).
        self._context: dict[RequestId, tuple[int, float]] = {}
        # (all models, models of ready endpoints); None after a change of endpoints, health or models.
        self._model_sets: tuple[frozenset[ModelName], frozenset[ModelName]] | None = None

    # ----------------------------------------------------------------- membership
    def sync(self, specs: Sequence[EndpointSpec]) -> None:
        """Make the endpoint set equal to `specs`, keeping runtime state of endpoints that stay.

        A removed endpoint takes no new requests; requests running there finish normally.
        """
        wanted = {s.id: s for s in specs}
        self._model_sets = None
        self._views.endpoints = None
        for eid in list(self._endpoints):
            if eid not in wanted:
                del self._endpoints[eid]
        # Forget what ran on removed endpoints: their complete() is then a no-op, and cannot decrement
        # an endpoint added again later under the same id.
        self._running = {r: e for r, e in self._running.items() if e in wanted}
        self._requests = {r: q for r, q in self._requests.items() if r in self._running}
        for eid, spec in wanted.items():
            ep = self._endpoints.get(eid)
            if ep is None:
                self._endpoints[eid] = _Endpoint(spec, self._views)
            elif ep.spec != spec:
                discovered = ep.models if not spec.models else spec.models
                if ep.spec.url != spec.url:  # a different server: start over
                    fresh = _Endpoint(spec, self._views)
                    fresh.inflight = ep.inflight
                    fresh.running_prompt_tokens = ep.running_prompt_tokens
                    fresh.running_output_tokens = ep.running_output_tokens
                    fresh.running = ep.running
                    fresh.cap = min(ep.cap, fresh.bound)
                    self._endpoints[eid] = fresh
                else:
                    old = ep.bound
                    ep.spec = spec
                    ep.cap = min(ep.cap, ep.bound) if ep.bound == old else ep.bound
                    ep.models = discovered
                    ep.changed()
        for i, ep in enumerate(self._endpoints.values()):
            ep.index = i

    def ids(self) -> list[EndpointId]:
        return list(self._endpoints)

    def restale(self) -> None:
        """Rebuild every view on next use (the staleness cut-off may have moved)."""
        for ep in self._endpoints.values():
            ep.changed()

    # ----------------------------------------------------------------- endpoint events
    def set_health(self, eid: EndpointId, health: EndpointHealth) -> bool:
        ep = self._endpoints.get(eid)
        if ep is None or ep.health is health:
            return False
        ep.health = health
        ep.changed()
        self._model_sets = None
        return True

    def set_models(self, eid: EndpointId, models: Iterable[str]) -> bool:
        """Models an endpoint reported at /v1/models; ignored when its models are configured."""
        ep = self._endpoints.get(eid)
        if ep is None or ep.spec.models:
            return False
        new = frozenset(ModelName(m) for m in models)
        if new == ep.models:
            return False
        ep.models = new
        ep.changed()
        self._model_sets = None
        return True

    def observe_gauges(self, eid: EndpointId, gauges: EngineGauges, now: float) -> None:
        ep = self._endpoints.get(eid)
        if ep is None:
            return
        if ep.spec.cap is None:
            self._learn_seats(ep, gauges)
        ep.gauges = gauges
        ep.scraped_at = now
        ep.dispatched_since_scrape = 0
        ep.completed_since_scrape = 0
        ep.changed()

    @staticmethod
    def _learn_seats(ep: _Endpoint, gauges: EngineGauges) -> None:
        """The engine's batch size from its gauges, for an endpoint whose cap the operator did not set.

        Once the engine kept requests waiting for two scrapes in a row (not one that arrived between two
        of its steps: it ran as many as it could), its batch size is the most it was seen running (its
        seats, or what its KV cache held), and the cap's bound one more than that: one request waits in
        the engine, so it never idles between a completion and the gateway's next dispatch, and a larger
        batch it can run shows in its gauges and raises the bound (the gateway keeps the rest, where its
        ordering and admission still decide; an engine's FCFS queue would take that away)."""
        if gauges.running is None:
            return
        prev = ep.gauges
        queued = bool(gauges.waiting) and prev is not None and bool(prev.waiting)
        if ep.seats is None and not queued:
            return
        before = prev.running if queued and prev is not None and prev.running is not None else 0.0
        seen = max(1, int(gauges.running), int(before))
        if ep.seats is not None and seen <= ep.seats:
            return
        old = ep.bound
        ep.seats = seen
        ep.cap = ep.bound if ep.cap == old else min(ep.cap, ep.bound)

    def set_estimates(self, eid: EndpointId, estimates: EndpointEstimates | None) -> None:
        ep = self._endpoints.get(eid)
        if ep is None or ep.estimates == estimates:
            return
        ep.estimates = estimates
        ep.changed()

    # ----------------------------------------------------------------- requests
    def dispatch(self, eid: EndpointId, req: SchedRequest, now: float) -> None:
        """`req` was placed on `eid` at `now`: it takes a seat there until `complete`."""
        ep = self._endpoints[eid]
        ep.inflight += 1
        ep.dispatched_since_scrape += 1
        predicted = max(0.0, (req.predicted_output_tokens or 0.0) - req.produced_tokens)
        prompt = resume_prompt_tokens(req)
        ep.running_prompt_tokens += prompt
        ep.running_output_tokens += predicted
        self._context[req.id] = (prompt, predicted)
        ep.running[req.id] = running_from(req, now, eid)
        ep.changed()
        self._running[req.id] = eid
        self._requests[req.id] = req

    def complete(self, req_id: RequestId) -> frozenset[ModelName]:
        """A dispatched request finished: its seat is free. The models of its endpoint (whose queues may
        move now); empty when it was not running on a known endpoint."""
        ep = self._release(req_id)
        if ep is None:
            return _NO_MODELS
        ep.completed_since_scrape += 1
        return ep.models

    def preempt(self, req_id: RequestId) -> SchedRequest | None:
        """A running request was preempted: its seat is free, without counting as a completion (its
        engine request is aborted). The request as it was dispatched; None when it was not running."""
        req = self._requests.get(req_id)
        if req is None or self._release(req_id) is None:
            return None
        return req

    def _release(self, req_id: RequestId) -> _Endpoint | None:
        """Free a running request's seat; its endpoint (None when it was not running on a known one)."""
        eid = self._running.pop(req_id, None)
        context = self._context.pop(req_id, None)
        self._requests.pop(req_id, None)
        if eid is None:
            return None
        ep = self._endpoints.get(eid)
        if ep is None:
            return None
        ep.running.pop(req_id, None)
        ep.inflight -= 1
        if context is not None:
            ep.running_prompt_tokens -= context[0]
            ep.running_output_tokens -= context[1]
        if ep.inflight == 0:
            ep.running_output_tokens = 0.0  # no float drift left behind
        ep.changed()
        return ep

    def progress(self, req_id: RequestId, produced: int, first_token_at: float | None, now: float) -> None:
        eid = self._running.get(req_id)
        ep = None if eid is None else self._endpoints.get(eid)
        if ep is None:
            return
        r = ep.running.get(req_id)
        if r is None:
            return
        before = r.produced or 0
        if produced > before:
            ep.streamed_tokens += produced - before
            # the time between two reports over the tokens between them (the first token's wait is none)
            since = r.reported_at if r.produced else first_token_at
            counted = produced - max(before, 1)
            if since is not None and counted > 0 and now >= since:
                ep.gap_s += now - since
                ep.gap_tokens += counted
                if since >= ep.cut_at:  # measured entirely under the cap in force
                    ep.gap_after_cut_s += now - since
                    ep.gap_after_cut_tokens += counted
        ep.running[req_id] = with_progress(r, produced, first_token_at, now)
        ep.changed()

    def pin(self, req_id: RequestId) -> None:
        """The running request can no longer be resumed faithfully: it is no victim any more."""
        req = self._requests.get(req_id)
        eid = self._running.get(req_id)
        ep = None if eid is None else self._endpoints.get(eid)
        if req is None or ep is None or not req.resumable:
            return
        self._requests[req_id] = dataclasses.replace(req, resumable=False)
        r = ep.running.get(req_id)
        if r is not None:
            ep.running[req_id] = dataclasses.replace(r, resumable=False)
            ep.changed()

    def running_on(self, req_id: RequestId) -> EndpointId | None:
        return self._running.get(req_id)

    def request(self, req_id: RequestId) -> SchedRequest | None:
        """A running request as it was dispatched."""
        return self._requests.get(req_id)

    def cap_of(self, eid: EndpointId) -> int | None:
        ep = self._endpoints.get(eid)
        return None if ep is None else ep.cap

    def set_cap(self, eid: EndpointId, cap: int, now: float = -math.inf) -> bool:
        """Put `cap` in force on `eid` (clamped into [1, its bound]); True if it changed. A cut is noted
        at `now` (the view's `cut_at`)."""
        ep = self._endpoints.get(eid)
        if ep is None:
            return False
        cap = max(1, min(cap, ep.bound))
        if cap == ep.cap:
            return False
        if cap < ep.cap:
            ep.cut_at = max(ep.cut_at, now)
        ep.cap = cap
        ep.changed()
        return True

    def inflight_on(self, eid: EndpointId) -> int:
        ep = self._endpoints.get(eid)
        return 0 if ep is None else ep.inflight

    # ----------------------------------------------------------------- views
    def views(self, now: float, stale_after_s: float) -> tuple[EndpointView, ...]:
        """Every endpoint's view as of `now` (the kept tuple while nothing changed or went stale)."""
        kept = self._views
        views = kept.endpoints
        if views is None or now >= kept.fresh_until - _STALE_MARGIN_S:
            eps = self._endpoints.values()
            views = kept.endpoints = tuple(ep.view(now, stale_after_s) for ep in eps)
            kept.fresh_until = min((ep.fresh_until for ep in eps), default=_INF)
            kept.dirty.clear()
        elif kept.dirty:
            # Only the changed endpoints' entries. The kept fresh_until stays at most every entry's own
            # (the others' did not move; a rebuilt one's is taken in), so staleness is never missed.
            entries = list(views)
            fresh_until = kept.fresh_until
            for ep in kept.dirty:
                entries[ep.index] = ep.view(now, stale_after_s)
                fresh_until = min(fresh_until, ep.fresh_until)
            kept.dirty.clear()
            views = kept.endpoints = tuple(entries)
            kept.fresh_until = fresh_until
        return views

    def view(self, eid: EndpointId, now: float, stale_after_s: float) -> EndpointView | None:
        ep = self._endpoints.get(eid)
        return None if ep is None else ep.view(now, stale_after_s)

    def models(self, *, ready_only: bool) -> frozenset[ModelName]:
        """Models served by any endpoint (in any state), or only by ready ones."""
        sets = self._model_sets or self._remake_model_sets()
        return sets[1] if ready_only else sets[0]

    def ready_models(self) -> frozenset[ModelName]:
        return (self._model_sets or self._remake_model_sets())[1]

    def _remake_model_sets(self) -> tuple[frozenset[ModelName], frozenset[ModelName]]:
        eps = self._endpoints.values()
        every = _NO_MODELS.union(*(ep.models for ep in eps))
        ready = _NO_MODELS.union(*(ep.models for ep in eps if ep.health is EndpointHealth.READY))
        self._model_sets = (every, ready)
        return self._model_sets
