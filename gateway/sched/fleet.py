"""The fleet as the scheduler holds it: each endpoint's runtime state, the requests running on it, the
views plugins see, and the sets of models served.

Every placement decides on a fresh `FleetSnapshot`, but an endpoint's view is rebuilt only when that
endpoint changed (or its engine gauges went stale): a placement on a large fleet does not remake the
views of the endpoints it did not touch. The model sets are likewise kept until an endpoint, its
health or its models change.

Each endpoint's runtime state and its kept view are `gateway.sched.endpoint_state`; here is the fleet of
them: membership, endpoint events, the requests running, caps, the other replicas' load (cluster mode),
and the views, columns and model sets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from gateway.core.types import EndpointHealth, EndpointId, EngineGauges, ModelName, RequestId
from gateway.sched.columns import columns_of, updated
from gateway.sched.endpoint_state import STALE_MARGIN_S, EndpointState, KeptViews
from gateway.sched.request import SchedRequest
from gateway.sched.running import RunningRequest, resume_prompt_tokens, running_from, with_progress
from gateway.sched.snapshot import EndpointEstimates, EndpointView, FleetColumns
from gateway.sched.types import NO_PEER_LOAD, PEER_SLO_CLASS, EndpointSpec, PeerLoad

#: At most this many stand-ins for other replicas' requests on one endpoint.
_MAX_STAND_INS: Final = 512

#: A progress report: (request, tokens streamed, its first token's time, the report's time).
Progress = tuple[RequestId, int, float | None, float]


def _stand_ins(eid: EndpointId, load: PeerLoad, now: float) -> tuple[RunningRequest, ...]:
    """Other replicas' requests on an endpoint as running requests of average size, decoding since
    `now` (the predictions then count them in the batch); never preempted (not resumable here)."""
    n = min(load.inflight, _MAX_STAND_INS)
    if n <= 0:
        return ()
    ctx = max(1, load.prompt_tokens // load.inflight)
    left = max(1.0, load.output_tokens / load.inflight)
    return tuple(
        RunningRequest(
            RequestId(f"peer:{eid}:{i}"),
            PEER_SLO_CLASS,
            ctx,  # prompt_tokens: the context so far
            left,  # output_mean: the tokens still to come
            0.0,  # output_std
            None,  # max_tokens
            now,  # dispatched_at
            None,  # ttft_deadline
            None,  # e2e_deadline
            None,  # itl_s
            False,  # best_effort
            False,  # resumable: never a victim here
            0,  # preemptions
            0,  # produced_before
            0,  # produced: decoding from now on
            now,  # first_token_at
            now,  # reported_at
        )
        for i in range(n)
    )


_NO_MODELS: Final[frozenset[ModelName]] = frozenset()
_INF: Final = math.inf


class Fleet:
    """Every endpoint's state and the requests dispatched to them. Changes come from the scheduler's
    events; the methods that answer a bool say whether anything changed (the queues may then move)."""

    __slots__ = ("_context", "_endpoints", "_model_sets", "_requests", "_running", "_views")

    def __init__(self) -> None:
        self._endpoints: dict[EndpointId, EndpointState] = {}
        self._views = KeptViews()
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
                self._endpoints[eid] = EndpointState(spec, self._views)
            elif ep.spec != spec:
                discovered = ep.models if not spec.models else spec.models
                if ep.spec.url != spec.url:  # a different server: start over
                    fresh = EndpointState(spec, self._views)
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
    def _learn_seats(ep: EndpointState, gauges: EngineGauges) -> None:
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

    def _release(self, req_id: RequestId) -> EndpointState | None:
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

    def progress_many(self, reports: Iterable[Progress]) -> None:
        """`progress` of each report in turn, each at its own time (a driver that holds the reports made
        between two of its calls into the scheduler hands them over in one)."""
        progress = self.progress
        for req_id, produced, first_token_at, now in reports:
            progress(req_id, produced, first_token_at, now)

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

    def size(self) -> int:
        """How many endpoints the fleet has."""
        return len(self._endpoints)

    def inflight_on(self, eid: EndpointId) -> int:
        """This gateway's own requests running on `eid` (the other replicas' are not counted)."""
        ep = self._endpoints.get(eid)
        return 0 if ep is None else ep.inflight

    def own_loads(self) -> dict[EndpointId, PeerLoad]:
        """This gateway's own load on each endpoint that has some (what a replica publishes): requests in
        flight, their context (prompt and tokens produced so far) and their predicted tokens to come."""
        out: dict[EndpointId, PeerLoad] = {}
        for eid, ep in self._endpoints.items():
            if not ep.inflight:
                continue
            ctx = 0
            left = 0.0
            for r in ep.running.values():
                done = r.produced or 0
                ctx += r.prompt_tokens + done
                left += max(1.0, r.output_mean - done)
            out[eid] = PeerLoad(ep.inflight, ctx, left)
        return out

    def observe_peers(self, loads: Mapping[EndpointId, PeerLoad], now: float) -> bool:
        """The other replicas' load per endpoint (absent: none), as of `now`; True when some endpoint's
        went down (room may have freed: the queues may move)."""
        freed = False
        for eid, ep in self._endpoints.items():
            load = loads.get(eid, NO_PEER_LOAD)
            if load != ep.peer:
                freed = freed or load.inflight < ep.peer.inflight
                ep.peer = load
                ep.peer_running = _stand_ins(eid, load, now)
                ep.changed()
        return freed

    # ----------------------------------------------------------------- views
    def views(self, now: float, stale_after_s: float) -> tuple[EndpointView, ...]:
        """Every endpoint's view as of `now` (the kept tuple while nothing changed or went stale)."""
        kept = self._views
        views = kept.endpoints
        if views is None or now >= kept.fresh_until - STALE_MARGIN_S:
            eps = self._endpoints.values()
            views = kept.endpoints = tuple(ep.view(now, stale_after_s) for ep in eps)
            kept.fresh_until = min((ep.fresh_until for ep in eps), default=_INF)
            kept.dirty.clear()
            kept.columns_changed = None
            kept.replaced = None
        elif kept.dirty:
            # Only the changed endpoints' entries. The kept fresh_until stays at most every entry's own
            # (the others' did not move; a rebuilt one's is taken in), so staleness is never missed.
            entries = list(views)
            fresh_until = kept.fresh_until
            changed = kept.columns_changed
            replaced = kept.replaced
            for ep in kept.dirty:
                entries[ep.index] = ep.view(now, stale_after_s)
                fresh_until = min(fresh_until, ep.fresh_until)
                if changed is not None:
                    changed.add(ep.index)
                if replaced is not None:
                    replaced.add(ep.index)
            kept.dirty.clear()
            views = kept.endpoints = tuple(entries)
            kept.fresh_until = fresh_until
        return views

    def replaced(self) -> set[int] | None:
        """The places in the tuple of views (`views`) whose entries were replaced since the last call;
        None when the tuple was remade whole since (or at the first call). The scheduler's memo of the
        views (`gateway.sched.snapshot.ViewsMemo`) is brought up to date at those places."""
        kept = self._views
        got = kept.replaced
        kept.replaced = set()
        return got

    def columns(self, now: float, stale_after_s: float) -> FleetColumns:
        """The columns of the views as of `now` (`views`): updated where endpoints changed since the
        last call, made whole after the tuple was remade or when many changed."""
        views = self.views(now, stale_after_s)
        kept = self._views
        cols = kept.columns
        if cols is not None and cols.endpoints is views:
            return cols
        changed = kept.columns_changed
        if cols is None or changed is None or len(changed) > len(views) // 4:
            cols = columns_of(views)
        else:
            cols = updated(cols, views, changed)
        kept.columns = cols
        kept.columns_changed = set()
        return cols

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
