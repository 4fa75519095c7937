"""Aladdin's best-fit request placement as a filter that keeps one endpoint.

(Over 450 lines: a sixth of it is this statement of the four constraints the filter checks; its bounds
and its orders already stand apart, in `best_fit_bounds` and `best_fit_order`.)

Endpoints are tried most loaded first, by ``capacity_norm`` = the L2 norm of (running / cap,
Σ(l_in + γ·l_out) / KV capacity); endpoints whose running requests are running long (their output
lengths were under-estimated, so they are more loaded than their predictions say) are tried last
(Aladdin's re-balancing for prediction error). Packing is for a fleet that shrinks: the endpoints it
leaves idle are the ones Aladdin's worker-count model (or an autoscaler) gives back. On a fixed fleet an
idle endpoint is free capacity, and the packed ones run their requests close to their deadlines, so two
other orders try the same constraints spread out instead: `order = "least-loaded"`, least capacity_norm
first, and `order = "least-outstanding"`, join-shortest-queue order (fewest requests in flight or waiting
there, the least-outstanding scorer's measure; Aladdin's own baseline), which weighs every request alike
whatever its length (least capacity_norm first sends long prompts to the endpoints whose requests have
short contexts, and their prefills pause those requests' decoding). A spreading order is by load alone
unless `rebalance_threshold` is set: the load already counts what a long runner still needs (its
remaining output is re-estimated once it is past its predicted length), and with mean predictions
about half of all requests outrun theirs before they end (early on day one, while a class's lengths
are predicted from the model's other classes, nearly all of its longer ones do: the benchmark's
generations at 225 tokens against 54 predicted), so the demotion moves new requests off the least
loaded endpoints onto busier ones (scheduling benchmark, coding-assistant, 5 seeds: day one pattern1
10.5 tasks/s 0.841 with the demotion, 0.854 without; pattern2 5.5 0.972 / 0.976).
A request with part of its prompt cached (`SchedRequest.cached`) tries first the endpoints holding
it whose predicted first token comes before the first-ordered endpoint's (`holders_first`): it stays
with its prefix exactly while waiting there costs less than the prefill it saves. The request goes to
the first endpoint where all four constraints hold; when none fits it stays queued (a fixed fleet:
waiting beats overloading):

(b) ATGT: ``k2·Σ(l_in + γ·l_out) <= θ·(T_dec − c2·b − c3)`` over the running requests and this one,
    ``T_dec`` the tightest ITL target among them; and this request's own end-to-end deadline kept at
    the per-token time of the batch it joins, within ``θ ·`` its time left;
(c) TTFT: the predicted first token (seat, iteration in flight, prefill with the pending prompts)
    comes within ``θ ·`` the time left to the request's first-token deadline;
(d) prefill pauses decode: this prompt's prefill within ``θ ·`` the time each decode with an ITL target
    has saved so far (tokens produced × (target − per-token time): Aladdin's constraint); with
    `deadlines` (the default), also the delay it causes each running request with a deadline (the
    prefill pauses its decoding; while both run, each iteration takes the newcomer's marginal cost
    longer) within the time that request has in hand, less a reserve of ``(1 − θ) ·`` its time left
    (without a reserve a packed endpoint's requests end up finishing just at their deadlines, where
    any prediction error is a miss); off, deadlines are left to the overflow guard;
(e) KV: the footprint of every request over its remaining iterations (``h·(context + t) + j`` until it
    ends) summed, at its peak, fits the endpoint's KV capacity (skipped while the capacity is unknown).

For the running requests l_in is the context so far and l_out what is left. A request's own targets (in
(b) and (c)) are dropped when it cannot meet them even alone on that endpoint, or when admission
demoted it to best-effort: it then goes where it harms no one. An endpoint with nothing running always
fits. When no endpoint fits with the θ reserve on the request's own deadlines, the least loaded (in
`least-outstanding` order, the least outstanding) endpoint that fits without that reserve takes it
(packing a request where it would only just make it leaves nothing for the requests that join later).
Output lengths are the predicted means, or the tail bound in `tail` mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Final, Literal

import numpy as np
import numpy.typing as npt
from msgspec import Meta

from gateway.core.types import RequestId
from gateway.sched.fleet_loads import COLUMNS_FROM_LOADS, fleet_loads
from gateway.sched.harms import breaks_deadlines
from gateway.sched.kv_peak import spans, surely_under
from gateway.sched.loads import LoadCache
from gateway.sched.memo import make_room
from gateway.sched.perf import PerfCoefficients
from gateway.sched.plugins.params import PredictionParams
from gateway.sched.plugins.placement.best_fit_bounds import (
    EAGER_TRIES,
    MIN_CANDIDATES,
    KeptNumbers,
    RejectGate,
    per_candidate,
    sure_misses_both,
    sure_misses_of_loads,
    sure_rejects,
    sure_rejects_columns,
)
from gateway.sched.plugins.placement.best_fit_order import few_busy, holders_first, only
from gateway.sched.predict import EndpointLoad, Prediction
from gateway.sched.registry import PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, resume_prompt_tokens
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot
from gateway.sched.targets import meets, time_left

#: Scale of the token dimension of capacity_norm when the KV capacity is unknown (tokens per seat).
TOKENS_PER_SEAT: Final = 2048.0
#: Aladdin's re-balancing in a packing order: endpoints whose running requests are, summed, this far past
#: their predicted lengths (in request lengths) are tried last.
DEFAULT_REBALANCE: Final = 0.5


#: A request's idle service by (id of the coefficients, prefill tokens): (those coefficients, prediction).
_IdleByCoef = dict[tuple[int, int], tuple[PerfCoefficients, Prediction]]


class BestFitParams(PredictionParams, frozen=True, kw_only=True):
    gamma: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5  # strictness: share of l_out counted in (b)
    theta: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.9  # margin for prediction error in (b) and (d)
    # Endpoints whose running requests are, summed, this far past their predicted lengths (in units of
    # one request's length) are tried last; 0: never. None (the default): 0.5 with "most-loaded" (a
    # packing order trusts the predicted lengths), never with a spreading order (the load it orders by
    # already counts what the long runners still need).
    rebalance_threshold: Annotated[float, Meta(ge=0.0)] | None = None
    # "most-loaded": Aladdin's best fit (packs work densely: the fewest endpoints busy);
    # "least-loaded": the same constraints tried on the least loaded endpoint first (a fixed fleet
    # with room to spare: small batches, more time in hand for every request);
    # "least-outstanding": tried in join-shortest-queue order (fewest requests in flight or waiting).
    order: Literal["most-loaded", "least-loaded", "least-outstanding"] = "most-loaded"
    # (d) also protects the end-to-end and first-token deadlines of running requests (not only ITL
    # targets, Aladdin's own case); off, that is left to the overflow guard.
    deadlines: bool = True
    # ... and only those whose time in hand is at least this share of their time left.
    on_track: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0


class BestFitFilter:
    name = "best-fit"
    # Its plain form derives each candidate's load: over columns it pays from this many candidates
    # (`gateway.sched.profile.ColumnsFrom`).
    columns_from = COLUMNS_FROM_LOADS

    def __init__(self, params: BestFitParams, loads: LoadCache | None = None) -> None:
        self.params = params
        self._cache = loads or LoadCache(params.predict_params())
        self.load_params = self._cache.params  # what its loads predict with
        self._fleet = fleet_loads(self._cache)
        self._gate = RejectGate()  # whether its sure misses are named up front (`sure_rejects`)
        self.numbers = KeptNumbers()  # its sure misses' last numbers (`best_fit_bounds._numbers`)
        self._packs = params.order == "most-loaded"
        by_count = self._by_count = params.order == "least-outstanding"
        self._spread_key = self.outstanding_key if by_count else self.least_loaded_key
        rebalance = params.rebalance_threshold
        if rebalance is None:
            rebalance = DEFAULT_REBALANCE if self._packs else 0.0
        self.rebalance = rebalance
        # (the memo keys of its order keys on each load: `_keys`; a str's hash is kept)
        tail = f"{params.gamma!r} {rebalance!r}"
        self._spread_memo = f"best-fit-spread {'count' if by_count else 'norm'} {tail}"
        self._order_memo = f"best-fit-order {tail}"
        # (the keys of what it keeps on each load's memo, made once: asked per candidate)
        self._norm_key = ("capacity-norm", params.gamma)
        self._tokens_key = ("tokens", params.gamma)
        # Per queued request: its idle service by (coefficients, prefill tokens) (`_idle_service`).
        self._idle: dict[
            RequestId, tuple[SchedRequest, dict[tuple[int, int], tuple[PerfCoefficients, Prediction]]]
        ] = {}

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        loads = self._cache.loads(candidates, snap.now, keep=False)
        # (candidates by their place in `candidates`: a load may stand for a later view than its own,
        # `LoadCache`; each order key is kept on its load, `_keys`)
        spread_keys, exact = self._keys(loads, self._spread_memo, self._spread_key)
        tried_keys = spread_keys
        if self._packs:
            tried_keys, packed_exact = self._keys(loads, self._order_memo, self.order_key)
            exact = exact and packed_exact
        n = len(loads)
        loose: dict[int, bool] = {}  # place -> whether it fits without the reserve
        if n and exact and not req.cached:
            # The first tried is the least key (no two are equal: each ends with its endpoint's id),
            # found without sorting (and without a key call per candidate): most requests are placed there.
            first = tried_keys.index(min(tried_keys))
            strict, loose[first] = self.fits_both(loads[first], req)
            if strict:
                return [candidates[first]]
        spread = sorted(range(n), key=spread_keys.__getitem__)
        tried = sorted(range(n), key=tried_keys.__getitem__) if self._packs else spread
        if req.cached:
            at = {id(load): k for k, load in enumerate(loads)}
            tried = [at[id(load)] for load in holders_first(req, [loads[k] for k in tried])]
        bounded = n < MIN_CANDIDATES or self._gate.named(req)  # (named: none left)
        # places of those where it surely does not fit with the reserve (known after the first tries):
        # not the answer while another fits with it, so tried only if none does
        no_strict: set[int] = set()
        for j, k in enumerate(tried):
            if j == EAGER_TRIES and not bounded:
                # Not placed on the first few: the sure misses found for all at once (best_fit_bounds)
                bounded = True
                misses, strict_misses = sure_misses_of_loads(self, loads, req)
                self._gate.seen(req, misses)
                for other, (miss, no) in enumerate(zip(misses, strict_misses, strict=True)):
                    if miss:
                        loose.setdefault(other, False)
                    elif no:
                        no_strict.add(other)
            if k in loose or k in no_strict:
                continue  # tried, a sure miss, or surely not with the reserve (its loose fit: below)
            strict, loose[k] = self.fits_both(loads[k], req)
            if strict:
                return [candidates[k]]
        # Nothing fits with the reserve on the request's own deadlines: the least loaded endpoint
        # that fits without it (the request meets its deadlines there if nothing else comes; those
        # passed over above tried now, in that order).
        for k in spread:
            fits = loose.get(k)
            if fits is None:
                fits = loose[k] = self.fits_both(loads[k], req)[1]
            if fits:
                return [candidates[k]]
        return []

    @staticmethod
    def _keys(
        loads: list[EndpointLoad], memo_key: str, make: Callable[[EndpointLoad], tuple[bool, float, str]]
    ) -> tuple[list[tuple[bool, float, str]], bool]:
        """`make(load)` of each load, kept on its memo under `memo_key` (a load is asked about by many
        placements while it is reused), and whether none is NaN (then the least is the first sorted)."""
        out: list[tuple[bool, float, str]] = []
        add = out.append
        exact = True
        for load in loads:
            memo = load.memo
            got: tuple[bool, float, str] | None = memo.get(memo_key)
            if got is None:
                got = memo[memo_key] = make(load)
            if got[1] != got[1]:
                exact = False
            add(got)
        return out, exact

    def sure_rejects(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> list[bool]:
        """Its sure misses, named up front for the filter before it when that pays (`SureRejects`)."""
        return sure_rejects(self, self._cache, self._gate, req, candidates, now=snap.now)

    def sure_rejects_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]:
        return sure_rejects_columns(self, self._fleet, self._gate, req, cols, candidates, now=snap.now)

    def filter_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]:
        """The columnar form: `filter`'s choice with the order keys of the endpoints that run something
        read from their loads' arrays (`FleetLoads`: an idle endpoint's is known from the columns:
        nothing runs long there, its capacity_norm is 0; and it fits), the order found by one sort of
        the keys, and a load made only for each endpoint tried in that order. A request with a cached
        prefix goes the plain way (`holders_first` predicts on the holders)."""
        idx = candidates.nonzero()[0]
        if len(idx) == 0:
            return candidates
        views = cols.endpoints
        if req.cached:
            at = {id(views[i]): int(i) for i in idx}
            out = np.zeros_like(candidates)
            for e in self.filter(req, [views[i] for i in idx], snap):
                out[at[id(e)]] = True
            return out
        now = snap.now
        busy = cols.busy[idx] > 0
        places = idx[busy]  # the busy candidates' places in the columns
        if not self._by_count and len(places) < self._fleet.least:
            return few_busy(self, self._cache, req, cols, candidates, places, now)
        flag = np.zeros(len(idx), dtype=np.bool_)
        norm = np.zeros(len(idx), dtype=np.float64)
        few = len(places) < self._fleet.least
        if few:  # a few: their loads, one by one
            rebalance = self.rebalance
            for k, i in zip(busy.nonzero()[0].tolist(), places.tolist(), strict=True):
                load = self._cache.load(views[i], now)
                flag[k] = load.running_long >= rebalance > 0
                if self._packs or not self._by_count:
                    norm[k] = self.capacity_norm(load)
        else:
            which = np.zeros_like(candidates)
            which[places] = True
            self._fleet.rows(cols, which, now)
            if self.rebalance > 0:
                flag[busy] = self.demoted(places)
            if self._packs or not self._by_count:
                norm[busy] = self.capacity_norms(places)
        rank = cols.id_rank[idx]
        spread_by = cols.outstanding[idx] if self._by_count else norm
        spread = np.lexsort((rank, spread_by, flag))
        tried = np.lexsort((rank, -norm, flag)) if self._packs else spread
        loose: dict[int, bool] = {}
        bounded = len(idx) < MIN_CANDIDATES or self._gate.named(req)
        # per candidate, whether it surely does not fit with the reserve (known after the first tries):
        # such a one cannot be the answer while another fits with it, so it is tried only if none does
        no_strict: list[bool] | None = None
        for j, k in enumerate(tried.tolist()):
            if j == EAGER_TRIES and not bounded and not few:
                # Not placed on the first few: the sure misses found for all at once, as `filter` does
                bounded = True
                rows = self._fleet.best_fit_rows(places, self.params.gamma)
                misses, strict_misses = sure_misses_both(self, rows, req, float(resume_prompt_tokens(req)))
                self._gate.seen(req, misses)
                for other, miss in zip(busy.nonzero()[0].tolist(), misses, strict=True):
                    if miss:
                        loose.setdefault(other, False)
                no_strict = per_candidate(busy, strict_misses)
            if k in loose:
                continue  # a sure miss
            if not busy[k]:
                return only(candidates, int(idx[k]))  # nothing runs there: it fits
            if no_strict is not None and no_strict[k]:
                continue  # not the answer while another fits with the reserve (its loose fit: below)
            strict, loose[k] = self.fits_both(self._cache.load(views[int(idx[k])], now), req)
            if strict:
                return only(candidates, int(idx[k]))
        # Nothing fits with the reserve: the least loaded endpoint that fits without it (those passed
        # over above tried now, in that order)
        for k in spread.tolist():
            fits = loose.get(k)
            if fits is None:
                fits = loose[k] = self.fits_both(self._cache.load(views[int(idx[k])], now), req)[1]
            if fits:
                return only(candidates, int(idx[k]))
        return np.zeros_like(candidates)

    @property
    def packs(self) -> bool:
        """Whether it tries the most loaded endpoints first."""
        return self._packs

    def capacity_norms(self, places: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        """`capacity_norm` of the loads at `places` of the columns (their rows up to date), from their
        arrays (`FleetLoads.capacity_norms`: math.hypot as `capacity_norm` takes it, kept per row)."""
        return self._fleet.capacity_norms(places, self.params.gamma, TOKENS_PER_SEAT)

    def demoted(self, places: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
        """`order_key`'s first term (tried last) of the loads at `places` of the columns, from arrays."""
        return (self._fleet.running_long(places) >= self.rebalance) & (self.rebalance > 0)

    def order_key(self, load: EndpointLoad) -> tuple[bool, float, str]:
        """Most loaded first; endpoints whose requests run long last."""
        rebalance = self.rebalance
        return (load.running_long >= rebalance > 0, -self.capacity_norm(load), str(load.view.id))

    def least_loaded_key(self, load: EndpointLoad) -> tuple[bool, float, str]:
        """Least loaded first; endpoints whose requests run long last (when rebalancing)."""
        rebalance = self.rebalance
        return (load.running_long >= rebalance > 0, self.capacity_norm(load), str(load.view.id))

    def outstanding_key(self, load: EndpointLoad) -> tuple[bool, float, str]:
        """Fewest requests in flight or waiting there first; endpoints whose requests run long last (when
        rebalancing)."""
        rebalance = self.rebalance
        return (load.running_long >= rebalance > 0, load.view.outstanding, str(load.view.id))

    def capacity_norm(self, load: EndpointLoad) -> float:
        key = self._norm_key
        got: float | None = load.memo.get(key)
        if got is None:
            scale = load.kv_capacity or load.seats * TOKENS_PER_SEAT
            got = load.memo[key] = math.hypot(load.n / load.seats, self._tokens(load) / scale)
        return got

    def _tokens(self, load: EndpointLoad) -> float:
        """Σ(l_in + γ·l_out) over the running requests (kept on the load)."""
        g = self.params.gamma
        key = self._tokens_key
        got: float | None = load.memo.get(key)
        if got is None:
            # (`RunningState.context` + γ·remaining of each, from the load's states as they are)
            got = load.memo[key] = sum(
                [
                    r.prompt_tokens + st[1] + g * st[2]
                    for r, st in zip(load.view.running, load.states, strict=True)
                ]
            )
        return got

    def _idle_service(self, load: EndpointLoad, req: SchedRequest) -> Prediction:
        """`load.idle_service(req)`, kept per request, coefficients and prefill tokens (all it depends on
        besides the parameters): a queued request is tried serve after serve on the endpoints that
        changed, whose loads are new but whose fitted coefficients are not."""
        got = self._idle.get(req.id)
        if got is None or got[0] is not req:
            make_room(self._idle, 2048)  # requests come and go: never grow without bound
            got = self._idle[req.id] = (req, {})
        coef = load.coef
        key = (id(coef), prefill_tokens(req, load.view.id))
        hit = got[1].get(key)
        if hit is not None and hit[0] is coef:
            return hit[1]
        pred = load.idle_service(req)
        got[1][key] = (coef, pred)
        return pred

    def _running_terms(self, load: EndpointLoad) -> tuple[float | None, float | None]:
        """What (b) and (d) take from the running requests alone (kept on the load): the tightest ITL
        budget among them (None: none has one), and the least time a decode with an ITL target has saved
        so far, over those that have saved some (None: none)."""
        key = ("best-fit-running",)
        got: tuple[float | None, float | None] | None = load.memo.get(key)
        if got is None:
            budget: float | None = None
            saved_least: float | None = None
            tpot_now = load.tpot_now
            # (each running request's prefilled and produced from the load's states, as `running` has
            # them, without making the running states)
            for r, st in zip(load.view.running, load.states, strict=True):
                if r.itl_s is None or r.best_effort:
                    continue
                budget = r.itl_s if budget is None else min(budget, r.itl_s)
                if st[0]:
                    saved = st[1] * (r.itl_s - tpot_now)
                    if saved >= 0 and (saved_least is None or saved < saved_least):
                        saved_least = saved
            got = load.memo[key] = (budget, saved_least)
        return got

    def violations(self, load: EndpointLoad, req: SchedRequest, *, reserve: bool = True) -> list[str]:
        """The constraints `req` would break on this endpoint: "seats", "atgt", "ttft", "prefill", "kv".
        With `reserve`, its own deadlines must be met within θ of its time left."""
        return list(self._broken(load, req, reserve=reserve))

    def _broken(self, load: EndpointLoad, req: SchedRequest, *, reserve: bool = True) -> Iterator[str]:
        """`violations` one at a time, in order: whether a request fits stops at the first (the later
        checks, the prefill pause's harms and the KV peak, are the costly ones)."""
        if load.n == 0:
            return
        if load.n >= load.seats:
            yield "seats"
            return
        pred, left, own, atgt = self._own_terms(load, req)
        keep = self.params.theta if reserve else 1.0
        if atgt or (own and left[1] is not None and pred.e2e_s > keep * left[1]):
            yield "atgt"
        # (c) TTFT
        if own and left[0] is not None and pred.ttft_s > keep * left[0]:
            yield "ttft"
        if self._pauses(load, req):
            yield "prefill"
        if self._over_kv(load, req, pred):
            yield "kv"

    def _own_terms(
        self, load: EndpointLoad, req: SchedRequest
    ) -> tuple[Prediction, tuple[float | None, float | None], bool, bool]:
        """The request's prediction here, its time left, whether its own targets count (`own`), and
        whether (b)'s batch bound breaks."""
        coef = load.coef
        p = self.params
        g, theta = p.gamma, p.theta
        pred = load.predict(req)
        left = time_left(req, load.now)
        own = not req.best_effort and meets(self._idle_service(load, req), left)
        # (b) ATGT: Aladdin's batch bound for the ITL targets here (this request's included), and this
        # request's own end-to-end deadline at the per-token time of the batch it joins
        budget, _ = self._running_terms(load)
        if own and req.slo.itl_ms is not None:
            mine = req.slo.itl_ms / 1000.0
            budget = mine if budget is None else min(budget, mine)
        atgt = False
        if budget is not None:
            t_dec = budget / (1.0 + load.overhead)
            total = self._tokens(load)
            total += req.prompt_tokens + g * pred.output_tokens
            atgt = coef.k2 * total > theta * (t_dec - coef.c2 * (load.n + 1) - coef.c3)
        return pred, left, own, atgt

    def _pauses(self, load: EndpointLoad, req: SchedRequest) -> bool:
        """(d) its prefill pauses every running decode: within θ of the time each decode with an ITL
        target has saved against it so far (tokens produced × (target − per-token time)); with
        `deadlines`, also within what each running request with a deadline has in hand, less a reserve
        of 1 − θ of its time left."""
        p = self.params
        theta = p.theta
        _, saved_least = self._running_terms(load)
        pause = load.coef.prefill_s(prefill_tokens(req, load.view.id))
        if saved_least is not None and pause > theta * saved_least:
            return True
        return p.deadlines and breaks_deadlines(load, req, theta=theta, on_track=p.on_track)

    @staticmethod
    def _over_kv(load: EndpointLoad, req: SchedRequest, pred: Prediction) -> bool:
        """(e) KV over future iterations."""
        cap = load.kv_capacity
        if cap is None:
            return False
        extra = (float(req.prompt_tokens), pred.output_tokens)
        # a bound first (kept on the load): on most endpoints it is clear of the capacity, and the
        # running requests need not be sorted for the peak (`KvPeak`)
        kept: float | None = load.memo.get("kv-spans")
        if kept is None:
            kept = load.memo["kv-spans"] = spans(load.kv_items())
        coef = load.coef
        if surely_under(kept, load.n, extra, h=coef.h, j=coef.j, cap=cap):
            return False
        return load.peak_kv(extra) > cap

    def fits(self, load: EndpointLoad, req: SchedRequest) -> bool:
        return next(self._broken(load, req), None) is None

    def fits_both(self, load: EndpointLoad, req: SchedRequest) -> tuple[bool, bool]:
        """(`fits`, fits without the θ reserve on its own deadlines) in one evaluation: only (b)'s and
        (c)'s tests of its own deadlines differ between the two."""
        if load.n == 0:
            return True, True
        if load.n >= load.seats:
            return False, False
        pred, left, own, atgt = self._own_terms(load, req)
        if atgt:
            return False, False
        strict = True
        if own:
            theta = self.params.theta
            ttft_left, e2e_left = left
            if e2e_left is not None:
                if pred.e2e_s > 1.0 * e2e_left:
                    return False, False
                strict = not pred.e2e_s > theta * e2e_left
            if ttft_left is not None:
                if pred.ttft_s > 1.0 * ttft_left:
                    return False, False
                strict = strict and not pred.ttft_s > theta * ttft_left
        if self._pauses(load, req) or self._over_kv(load, req, pred):
            return False, False
        return strict, True


SPEC = PluginSpec(
    PluginKind.FILTER,
    "best-fit",
    BestFitParams,
    lambda p, ctx: BestFitFilter(p, ctx.loads.get(p.predict_params())),
    "Aladdin: most loaded endpoint where ATGT, TTFT, prefill-pause and KV constraints hold",
)
