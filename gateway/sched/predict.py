"""Latency predictions for ordering, placement and admission, from an endpoint's view alone (sans-IO).

Inputs are what the snapshot carries: the endpoint's fitted performance model (`EndpointView.perf`,
Aladdin's ``t_pre = k1·Σ l_in + c1``, ``t_dec = (k2·l_avg + c2)·b + c3``, ``kv = h·l + j``; the
generic prior until telemetry has fitted one), its KV capacity, its concurrency cap, and the requests
the gateway runs there (`EndpointView.running`: prompt, predicted output mean and spread, dispatch time,
deadlines).

**Where a running request has got to.** The dispatcher reports every few tokens a stream carries
(`Scheduler.progress`); between reports, and for requests without any (not streamed, or none yet),
progress is estimated from time: a request's first token is due one prefill after its dispatch, then
it produces one token per decode iteration of the endpoint's current batch, slowed by the prefills of
new arrivals: each running request paused the batch for its own prefill once in its lifetime, so the
batch spends ``ρ = Σ prefill_i / lifetime_i`` of its time prefilling and every decode iteration
effectively takes ``1 / (1 − ρ)`` as long (at least `prefill_overhead`). (The gateway's measured
per-token time is not used for this: it was measured at other batch sizes.) A request past its
predicted length is *running long* (its length was under-estimated); it is then expected to
run half as long again as it has (capped by max_tokens), and it counts towards the endpoint's
`running_long` figure, which placement uses to steer new arrivals elsewhere (Aladdin's re-balancing).

**A new request placed on the endpoint now.** It waits for a seat (the cap; when every seat is taken,
until the ``k``-th running request is predicted to finish) and half a decode iteration, is prefilled
together with the prompts dispatched there that have not had their first token yet, then decodes at the
per-token time of the batch it joins. Its output is the predicted mean, or in a tail mode the mean plus
``γ·σ`` with ``γ = z(1 − τ)`` (normal) or ``sqrt((1 − τ)/τ)`` (Cantelli, any distribution).

**Cached prompt tokens.** Every prefill term (a new request's, the pending prompts', the running
requests' share of the batch's time) counts only the tokens the engine computes: the prompt less the
prefix the endpoint is predicted to hold (`SchedRequest.cached`, `RunningRequest.cached_tokens`; see
`gateway.sched.prefix`). Contexts (decode cost, KV) count the whole prompt. So a request placed where its
prefix is cached is predicted to start sooner there, and a choice between endpoints weighs the wait on
the one holding the prefix against the prefill it saves, in the request's own SLO terms.

Results are seconds from `now`; whether they keep a request's targets is `gateway.sched.targets`.
`gateway.sched.loads.LoadCache` keeps one `EndpointLoad` per endpoint view for as long as the view
object is the same and the clock moved less than 100-200 ms, so ordering a long queue costs a few
arithmetic operations per request and endpoint.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Final

from gateway.sched.joining import join_delays
from gateway.sched.kv_peak import KvPeak, peak_kv
from gateway.sched.load_terms import (
    LONG_GROWTH,
    Like,
    Pace,
    RequestTerms,
    RunningState,
    State,
    pace_for,
    request_terms,
    states_of,
)
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.sched.prediction import Harm, Prediction, PredictParams, Tail, seats_of
from gateway.sched.request import SchedRequest
from gateway.sched.running import (
    RunningRequest,
    output_estimate,
    prefill_tokens,
    remaining_max_tokens,
    resume_prompt_tokens,
)
from gateway.sched.snapshot import EndpointView

_PRIOR: Final = default_prior()


class _LastOutput:
    """`EndpointLoad.output_tokens`' last answer (a pure function of an immutable request and gamma)."""

    __slots__ = ("gamma", "out", "req")

    def __init__(self) -> None:
        self.req: SchedRequest | None = None
        self.gamma = 0.0
        self.out = 0.0


_LAST_OUTPUT: Final = _LastOutput()


class EndpointLoad:
    """One endpoint's load at `now`, derived from its view once and queried per request."""

    __slots__ = (
        "_pace",
        "_running",
        "_seat_free",
        "_states",
        "coef",
        "ctx_sum",
        "gamma",
        "kv_capacity",
        "memo",
        "n",
        "now",
        "overhead",
        "params",
        "pending_prompt",
        "running_long",
        "seats",
        "tpot_now",
        "view",
        "wait_s",
    )

    def __init__(
        self,
        view: EndpointView,
        now: float,
        params: PredictParams,
        *,
        like: Like | None = None,
        pace: Pace | None = None,
    ) -> None:
        """`like`: a load of the same endpoint at another time, whose clock-independent terms are taken
        over when its view has the same inputs (`same_inputs`) and its parameters are the same (the
        result is the same as without it); `pace`: those terms, known to be the view's."""
        self.view = view
        self.now = now
        self.params = params
        # What the placement and admission plugins derive from this load alone (the same for every
        # request they ask about), kept here by whoever derives it (`gateway.sched.harms`).
        self.memo: dict[Hashable, Any] = {}
        gamma = self.gamma = params.gamma
        # (`view.perf`, `view.kv_capacity_tokens` and `seats_of` spelled out: a load is made per endpoint
        # every 100-200 ms on a busy fleet)
        est = view.estimates
        coef: PerfCoefficients = (None if est is None else est.perf) or _PRIOR
        self.coef = coef
        self.kv_capacity = None if est is None else est.kv_capacity_tokens
        mb, cap = view.max_batch, view.cap
        seats = cap if mb is None or mb >= cap else mb
        seats = self.seats = seats if seats > 1 else 1
        reqs = view.running
        n = self.n = len(reqs)
        if pace is None:
            pace = pace_for(view, coef, params, like)
        self._pace = pace
        self.overhead = pace.overhead
        over = 1.0 + pace.overhead
        guess = pace.guess
        k1, c1 = coef.k1, coef.c1
        # The running states (`running`) are made from `states` only when asked for: most loads are only
        # asked for their sums.
        # (what `running_states` reads of each running request besides its progress is kept on the pace:
        # a load remade for its age alone, most of those made on a busy fleet, reads only the progress)
        kept = pace.terms
        if kept is not None and kept[0] is coef and kept[1] == gamma:
            terms: list[RequestTerms] = kept[2]  # type: ignore[assignment]
        else:
            terms = request_terms(reqs, pace.fresh, k1=k1, c1=c1, guess=guess, gamma=gamma)
            pace.terms = (coef, gamma, terms)
        states, pending, ctx_sum, long_total = states_of(reqs, terms, now, guess)
        self.ctx_sum = ctx_sum
        self.pending_prompt = pending
        self.running_long = long_total
        # (`coef.decode_iter_s(n, ctx_sum / n) * over`, spelled out)
        tpot = self.tpot_now = ((coef.k2 * (ctx_sum / n) + coef.c2) * n + coef.c3) * over if n else 0.0
        self._states = states
        self._running: tuple[RunningState, ...] | None = None
        # The running requests' predicted ends, sorted, made when first asked for (`seat_free`): a load
        # with a free seat needs none of them for its own wait.
        self._seat_free: list[float] | None = None
        if n < seats:
            self.wait_s = 0.5 * tpot
        else:
            self._seat_free = self._ends(k1 * pending + c1 if pending else 0.0)
            self.wait_s = self._seat_free[n - seats] + 0.5 * tpot

    def _ends(self, prefill_pending: float) -> list[float]:
        """Each running request's predicted end, now that the per-token time is known, sorted."""
        tpot = self.tpot_now
        return sorted([st[2] * tpot + (0.0 if st[0] else prefill_pending) for st in self._states])

    @property
    def seat_free(self) -> list[float]:
        """The running requests' predicted ends (seconds from now), sorted: when each frees its seat."""
        got = self._seat_free
        if got is None:
            pending = self.pending_prompt
            got = self._seat_free = self._ends(self.coef.k1 * pending + self.coef.c1 if pending else 0.0)
        return got

    @property
    def guessed(self) -> bool:
        """Whether it predicts from the generic prior (no fit, no configured prior): a guess about other
        hardware."""
        return self.coef == _PRIOR

    @property
    def pace(self) -> Pace:
        """What this load took from its view alone (for a load of the same view at another time)."""
        return self._pace

    @property
    def states(self) -> list[State]:
        """Per running request, in the view's order: (prefilled, produced, remaining, first_s, long), as
        its running state (`running`) has them, without making the states (read-only)."""
        return self._states

    @property
    def prefill_pending(self) -> float:
        """The pending prompts' prefill (0 without any): what a running request not yet prefilled waits
        for besides its remaining tokens (`RunningState.finish_s`)."""
        pending = self.pending_prompt
        return self.coef.k1 * pending + self.coef.c1 if pending else 0.0

    @property
    def running(self) -> tuple[RunningState, ...]:
        """The running requests as of `now` (estimated), in the view's order."""
        got = self._running
        if got is None:
            tpot = self.tpot_now
            prefill_pending = self.prefill_pending
            got = self._running = tuple(
                [
                    RunningState(
                        r,
                        prefilled,
                        produced,
                        remaining,
                        remaining * tpot + (0.0 if prefilled else prefill_pending),
                        first_s,
                        long,
                    )
                    for r, (prefilled, produced, remaining, first_s, long) in zip(
                        self.view.running, self._states, strict=True
                    )
                ]
            )
        return got

    def kv_items(self) -> list[tuple[float, float]]:
        """(`RunningState.context`, `remaining`) of each running request, in the view's order."""
        return [
            (r.prompt_tokens + st[1], st[2]) for r, st in zip(self.view.running, self._states, strict=True)
        ]

    def remaining_total(self) -> float:
        """The running requests' remaining output tokens, summed (from the sums kept, without making
        their running states)."""
        return sum([st[2] for st in self._states])

    # ----------------------------------------------------------------- queries
    def times(
        self, prompt: float, out: float, fresh: float | None = None
    ) -> tuple[float, float, float, float]:
        """(first token, last token) of a request with `prompt` tokens and `out` output tokens, alone
        on this endpoint and placed on it now: `idle_service` and `predict` in a few arithmetic
        operations, for ordering long queues. `fresh`: the prompt tokens its prefill computes here (the
        uncached ones, `prefill_tokens`); None: all of them."""
        c = self.coef
        over = 1.0 + self.overhead
        steps = out - 1.0 if out > 1.0 else 0.0
        pre = prompt if fresh is None else fresh
        idle_ttft = c.k1 * pre + c.c1
        alone = 1.0 + self.params.prefill_overhead
        idle_e2e = idle_ttft + steps * ((c.k2 * (prompt + 0.5 * out) + c.c2) + c.c3) * alone
        n = self.n
        b = n + 1 if n + 1 < self.seats else self.seats
        ttft = self.wait_s + c.k1 * (pre + self.pending_prompt) + c.c1
        avg = (self.ctx_sum + prompt + 0.5 * out) / (n + 1)
        e2e = ttft + steps * ((c.k2 * avg + c.c2) * b + c.c3) * over
        return idle_ttft, idle_e2e, ttft, e2e

    def tpot(self, batch: float, avg_context: float, *, alone: bool = False) -> float:
        """Per-token seconds of a decode batch (prefill pauses included: at this endpoint's current
        share, or for a request `alone`, the configured floor)."""
        over = self.params.prefill_overhead if alone else self.overhead
        return self.coef.decode_iter_s(batch, avg_context) * (1.0 + over)

    def output_tokens(self, req: SchedRequest) -> float:
        """The output length to plan for: the mean, or in a tail mode the bound; never past max_tokens
        (the engine stops there). The last answer is kept: one request is asked about on every
        endpoint in a row."""
        last = _LAST_OUTPUT
        gamma = self.gamma
        if last.req is req and last.gamma == gamma:
            return last.out
        mean, std = output_estimate(req)
        bound = mean + gamma * std
        cap = remaining_max_tokens(req)
        out = bound if cap is None else min(bound, float(cap))
        last.req, last.gamma, last.out = req, gamma, out
        return out

    def predict(self, req: SchedRequest, *, worst_case: bool = False) -> Prediction:
        """`req` dispatched here now. `worst_case`: decode as if every seat were taken (MaaSO's
        worst-case throughput) instead of the batch it joins."""
        out = self.output_tokens(req)
        # `resume_prompt_tokens`, `PerfCoefficients.prefill_s`, `tpot` and min/max spelled out, the same
        # operations in the same order: asked for every candidate of a placement.
        p = float(req.prompt_tokens + req.produced_tokens)
        c = self.coef
        ttft = self.wait_s + (c.k1 * (prefill_tokens(req, self.view.id) + self.pending_prompt) + c.c1)
        n, seats = self.n, self.seats
        b = float(seats) if worst_case else float(n + 1 if n + 1 < seats else seats)
        avg_ctx = (self.ctx_sum + p + 0.5 * out) / (n + 1)
        tpot = ((c.k2 * avg_ctx + c.c2) * b + c.c3) * (1.0 + self.overhead)
        steps = out - 1.0
        e2e = ttft + (steps if steps > 0.0 else 0.0) * tpot
        return Prediction(self.wait_s, ttft, e2e, tpot, out)

    def predict_after(self, req: SchedRequest, wait_s: float) -> Prediction:
        """`req` starting here after `wait_s` (a seat frees then), into a full batch."""
        out = self.output_tokens(req)
        p = float(resume_prompt_tokens(req))
        ttft = wait_s + self.coef.prefill_s(prefill_tokens(req, self.view.id))
        avg_ctx = (self.ctx_sum + p + 0.5 * out) / (self.n + 1)
        tpot = self.tpot(float(self.seats), avg_ctx)
        return Prediction(wait_s, ttft, ttft + max(0.0, out - 1.0) * tpot, tpot, out)

    def idle_service(self, req: SchedRequest) -> Prediction:
        """`req` alone on this endpoint (no wait, batch of one): the least it can take here."""
        return idle_service(self.view, req, self.params)

    def harm(self, req: SchedRequest, *, on_track: float = 0.0) -> list[Harm]:
        """What placing `req` here now costs each running request that has a target to keep.

        Its prefill pauses every decode (the whole prefill; a request still waiting for its own first
        token is prefilled with it instead and waits ``k1·p`` longer), and for as many iterations as
        both run, every decode iteration takes its marginal cost ``k2·context + c2`` longer. `saved` is
        the time the running request has in hand: its deadline minus its predicted last (or first)
        token; for an ITL target, the target minus the per-token time now, and the delay is per token.
        Requests without targets, demoted ones and those already late are left out (nothing to keep);
        with `on_track` > 0, so are those whose time in hand is less than that share of their time left
        (within the error of the predictions they are as likely to miss as not: holding every new request
        off their endpoint for them would starve the queue on a fixed fleet).
        """
        if not self.running:
            return []
        first, pause, per_iter, out = join_delays(self, req)
        now = self.now
        harms: list[Harm] = []
        for s in self.running:
            r = s.req
            if r.best_effort:
                continue
            if not s.prefilled and r.ttft_deadline is not None:
                saved = r.ttft_deadline - now - s.first_s
                if saved >= on_track * (r.ttft_deadline - now) and saved >= 0:
                    harms.append(Harm(s, "ttft", first, saved, r.ttft_deadline - now))
            if r.e2e_deadline is not None:
                saved = r.e2e_deadline - now - s.finish_s
                if saved >= on_track * (r.e2e_deadline - now) and saved >= 0:
                    delay = (first if not s.prefilled else pause) + min(s.remaining, out) * per_iter
                    harms.append(Harm(s, "e2e", delay, saved, r.e2e_deadline - now))
            if r.itl_s is not None and s.prefilled:
                saved = r.itl_s - self.tpot_now
                if saved >= on_track * r.itl_s and saved >= 0:
                    harms.append(Harm(s, "itl", per_iter, saved, r.itl_s))
        return harms

    def endangered(
        self, req: SchedRequest, *, margin: float = 1.0, on_track: float = 0.0
    ) -> list[RunningState]:
        """Running requests that keep their targets now but would miss them once `req` is placed here
        (`margin` < 1 demands that some of their time in hand is left; `on_track`: see `harm`)."""
        return [h.state for h in self.harm(req, on_track=on_track) if h.delay > h.saved * margin]

    def peak_kv(self, extra: tuple[float, float] | None = None) -> float:
        """The largest KV footprint (tokens) the running requests (and `extra` = (context now,
        remaining tokens) of a new one) reach over their remaining iterations (Aladdin's constraint
        (e)): a request holds ``h·(context + t) + j`` at iteration t until it ends."""
        # (each running request's context and remaining tokens as `running` has them, from the states
        # without making the running states)
        if extra is None:
            return peak_kv(self.kv_items(), self.coef.h, self.coef.j)
        # asked for many requests in turn (best fit's constraint (e)): the running requests kept sorted
        got: KvPeak | None = self.memo.get("kv-peak")
        if got is None:
            got = self.memo["kv-peak"] = KvPeak(self.kv_items(), self.coef.h, self.coef.j)
        return got.with_extra(*extra)


def running_states(
    reqs: Sequence[RunningRequest],
    fresh: Sequence[int],
    now: float,
    *,
    guess: float,
    k1: float,
    c1: float,
    gamma: float,
) -> tuple[list[State], float, float, float]:
    """Each of `reqs`' state at `now` (`fresh`: its prompt tokens not cached, `guess`: the per-token
    time, `k1`/`c1`: the prefill's coefficients), in order, and their sums: the pending prompt tokens of
    those not prefilled, the contexts, the long shares (each added one after another from 0.0)."""
    # (the same arithmetic as a load's states from the terms kept on its pace: `states_of`)
    terms = request_terms(reqs, fresh, k1=k1, c1=c1, guess=guess, gamma=gamma)
    return states_of(reqs, terms, now, guess)


def idle_service(view: EndpointView, req: SchedRequest, params: PredictParams) -> Prediction:
    """`req` alone on the endpoint of `view` (no wait, batch of one): `EndpointLoad.idle_service`, which
    needs the endpoint's coefficients only (not its load)."""
    coef = view.perf or _PRIOR
    mean, std = output_estimate(req)
    bound = mean + params.gamma * std
    cap = remaining_max_tokens(req)
    out = bound if cap is None else min(bound, float(cap))
    p = float(resume_prompt_tokens(req))
    ttft = coef.prefill_s(prefill_tokens(req, view.id))
    tpot = coef.decode_iter_s(1.0, p + 0.5 * out) * (1.0 + params.prefill_overhead)
    return Prediction(0.0, ttft, ttft + max(0.0, out - 1.0) * tpot, tpot, out)


__all__ = [
    "LONG_GROWTH",
    "EndpointLoad",
    "Harm",
    "PredictParams",
    "Prediction",
    "RunningState",
    "Tail",
    "idle_service",
    "peak_kv",
    "seats_of",
]
