"""Whether placing a request on an endpoint harms a running request there, without listing the harms.

`EndpointLoad.harm` lists what a new request costs each running request with a target, and the overflow
guard and best fit only ask whether any of those costs is more than the request can take. Most of that
question does not depend on the new request: which running requests have a target to keep, the time each
has in hand, and how much of its answer is left. Those terms are derived once per endpoint load and kept
on it (`EndpointLoad.memo`, for as long as the load is reused: one served queue); per new request only
its prefill pause and per-iteration cost are computed, and compared with the least time in hand (first
tokens, inter-token targets) or with each running request's deadline in a tight loop (last tokens). The
answers are those of `harm`, exactly (`tests/unit/test_sched_harms.py` checks both on random loads).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Final

from gateway.sched.joining import join_delays
from gateway.sched.predict import EndpointLoad
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, resume_prompt_tokens
from gateway.sched.snapshot import EndpointView


@dataclass(slots=True)
class HarmTerms:
    """A load's running requests with a target to keep, as `harm` filters them for one `on_track`, each
    with the bound its delay is compared to (`bound(saved, left)`). Read-only once made (not frozen: a
    frozen dataclass sets each field through `object.__setattr__`, and one is made per load remade)."""

    ttft: float | None  # the least bound over the first-token harms (all have the same delay)
    itl: float | None  # the least bound over the inter-token harms (likewise)
    # (prefilled, remaining tokens, bound) per last-token harm, the least bound first (the likeliest to
    # be over is asked first)
    e2e: tuple[tuple[bool, float, float], ...]
    # over those: the least bound and the most remaining tokens (a delay none of them can be over:
    # `_any_over`)
    e2e_least: float = 0.0
    e2e_most: float = 0.0


def _terms(load: EndpointLoad, on_track: float, margin: float | None, theta: float | None) -> HarmTerms:
    """`harm`'s filter of the running requests, with bound = saved · margin (`endangers`), or for the
    deadline harms saved − (1 − θ) · left (`breaks_deadlines`, `theta` given; inter-token harms left out)."""
    key = ("harm-terms", on_track, margin, theta)
    got: HarmTerms | None = load.memo.get(key)
    if got is not None:
        return got
    now = load.now
    tpot_now = load.tpot_now
    ttft: float | None = None
    itl: float | None = None
    e2e: list[tuple[bool, float, float]] = []
    reserve = 0.0 if theta is None else 1.0 - theta
    prefill_pending = load.prefill_pending
    # the load's states read as they are (`EndpointLoad.states`), each finish as `RunningState.finish_s`
    for r, (prefilled, _, remaining, first_s, _) in zip(load.view.running, load.states, strict=True):
        if r.best_effort:
            continue
        if not prefilled and r.ttft_deadline is not None:
            left = r.ttft_deadline - now
            saved = left - first_s
            if saved >= on_track * left and saved >= 0:
                b = saved * margin if margin is not None else saved - reserve * left
                ttft = b if ttft is None or b < ttft else ttft
        if r.e2e_deadline is not None:
            left = r.e2e_deadline - now
            saved = left - (remaining * tpot_now + (0.0 if prefilled else prefill_pending))
            if saved >= on_track * left and saved >= 0:
                b = saved * margin if margin is not None else saved - reserve * left
                e2e.append((prefilled, remaining, b))
        if margin is not None and r.itl_s is not None and prefilled:
            saved = r.itl_s - tpot_now
            if saved >= on_track * r.itl_s and saved >= 0:
                b = saved * margin
                itl = b if itl is None or b < itl else itl
    e2e.sort(key=_BOUND)
    out = HarmTerms(
        ttft, itl, tuple(e2e), e2e[0][2] if e2e else 0.0, max([t[1] for t in e2e]) if e2e else 0.0
    )
    load.memo[key] = out
    return out


_BOUND: Final = itemgetter(2)  # a last-token term's bound (a key called in C)


def _any_over(load: EndpointLoad, req: SchedRequest, terms: HarmTerms) -> bool:
    """Whether the delay `req` causes one of the running requests of `terms` is over its bound (the
    delays as `harm` computes them)."""
    if terms.ttft is None and terms.itl is None and not terms.e2e:
        return False
    first, pause, per_iter, out = join_delays(load, req)
    return _over(terms, first, pause, per_iter, out)


def _over(terms: HarmTerms, first: float, pause: float, per_iter: float, out: float) -> bool:
    """`_any_over` given the request's delays (`join_delays`)."""
    if terms.ttft is not None and first > terms.ttft:
        return True
    if terms.itl is not None and per_iter > terms.itl:
        return True
    if not terms.e2e:
        return False
    # The delay of each is at most `pause + min(most remaining, out) · per_iter` when the pause is the
    # longer and the iterations take time (rounding is monotonic): under the least bound, none is over.
    if per_iter >= 0.0 and pause >= first and pause + min(terms.e2e_most, out) * per_iter <= terms.e2e_least:
        return False
    for prefilled, remaining, bound in terms.e2e:
        if (pause if prefilled else first) + min(remaining, out) * per_iter > bound:
            return True
    return False


def terms_of(load: EndpointLoad, on_track: float, margin: float) -> HarmTerms:
    """The terms `endangers` compares a new request's delays with (kept on the load): for placement
    over columns (`gateway.sched.fleet_loads`), which compares them for many loads at once."""
    return _terms(load, on_track, margin, None)


def endangers(load: EndpointLoad, req: SchedRequest, *, margin: float = 1.0, on_track: float = 0.0) -> bool:
    """`bool(load.endangered(req, margin=margin, on_track=on_track))` (`margin` > 0)."""
    return _any_over(load, req, _terms(load, on_track, margin, None))


class Sparing:
    """One request's placement judged load by load, for the loads of one cache (the same prediction
    parameters: one output estimate for `req`), with what it takes from the request alone (prompt,
    output estimate, its deadlines times the margin) taken once: the output estimate from the first load
    asked (and again when a load of another cache's parameters is asked), shared by both questions.

    - `spares(load)`: `not endangers(load, req, margin=margin, on_track=on_track)`;
    - `keeps(load)`: `meets(pred, left, margin) and itl_ok(req, pred)` for `pred = load.predict(req,
      worst_case=worst_case)` (`left` given: the request's time left), `predict`'s arithmetic in its
      order.

    The answers are those of the plain computations, bit for bit (`tests/unit/test_sched_harms.py`,
    `tests/unit/test_sched_guard_keeping.py`). One load at a time, as the overflow guard makes them: a
    load remade for the question is judged before the next is made, so a placement does not hold every
    candidate's new load and terms at once (that made a young collection of nearly every placement)."""

    __slots__ = (
        "_cached",
        "_context",
        "_e2e",
        "_gamma",
        "_itl",
        "_margin",
        "_on_track",
        "_out",
        "_p",
        "_req",
        "_steps",
        "_ttft",
        "_whole",
        "_worst",
    )

    def __init__(
        self,
        req: SchedRequest,
        *,
        margin: float = 1.0,
        on_track: float = 0.0,
        left: tuple[float | None, float | None] = (None, None),
        worst_case: bool = False,
    ) -> None:
        self._req = req
        self._margin = margin
        self._on_track = on_track
        self._worst = worst_case
        ttft_left, e2e_left = left
        self._ttft = None if ttft_left is None else ttft_left * margin
        self._e2e = None if e2e_left is None else e2e_left * margin
        self._itl = req.slo.itl_ms
        self._p = float(resume_prompt_tokens(req))
        self._whole = req.prompt_tokens + req.produced_tokens
        self._cached = bool(req.cached)
        self._gamma: float | None = None  # with `_out`, `_context` and `_steps`: `_estimate`
        self._out = 0.0
        self._context = 0.0
        self._steps = 0.0

    def _estimate(self, load: EndpointLoad) -> None:
        """The request's output estimate on `load`'s parameters, and what both questions derive from it."""
        self._gamma = load.gamma
        out = self._out = load.output_tokens(self._req)
        self._context = self._p + 0.5 * out
        self._steps = max(0.0, out - 1.0)

    def spares(self, load: EndpointLoad) -> bool:
        req = self._req
        terms = _terms(load, self._on_track, self._margin, None)
        if terms.ttft is None and terms.itl is None and not terms.e2e:
            return True
        if self._gamma is None or load.gamma != self._gamma:
            self._estimate(load)
        c = load.coef
        # `join_delays`, term by term
        fresh = prefill_tokens(req, load.view.id) if self._cached else self._whole
        per_iter = (c.k2 * self._context + c.c2) * (1.0 + load.overhead)
        first = c.k1 * fresh
        return not _over(terms, first, c.k1 * fresh + c.c1, per_iter, self._out)

    def judge(
        self, views: Sequence[EndpointView], loads: Iterable[EndpointLoad], *, own: bool
    ) -> tuple[list[EndpointView], list[EndpointView]]:
        """The views whose load (`loads`, in the same order, taken one at a time) it `spares`, and of
        those (`own`) the ones whose load it `keeps`: both questions spelled out in one loop over what
        each load keeps for them (`_GuardRow`, on the load's memo), the same operations in the same
        order (the same answers, bit for bit). For the overflow guard's plain form, which asks them of
        every candidate."""
        harmless: list[EndpointView] = []
        meeting: list[EndpointView] = []
        on_track, margin, worst = self._on_track, self._margin, self._worst
        key = _row_key(on_track, margin, worst)
        req = self._req
        whole = self._whole
        # the tokens its prefill computes where part of its prompt is cached (`prefill_tokens`);
        # elsewhere all of them
        fresh_at = {e: prefill_tokens(req, e) for e in req.cached} if self._cached else None
        p = self._p
        ttft_bound, e2e_bound, itl_bound = self._ttft, self._e2e, self._itl
        gamma = self._gamma  # (with what `_estimate` derives: made again when a load's parameters differ)
        out, context, steps = self._out, self._context, self._steps
        for view, load in zip(views, loads, strict=True):
            row: _GuardRow | None = load.memo.get(key)
            if row is None:
                row = load.memo[key] = _guard_row(load, on_track, margin, worst_case=worst)
            terms, k1, c1, k2, c2, c3, over, wait_s, pending, ctx_sum, n1, b, lgamma = row
            if gamma is None or lgamma != gamma:
                self._estimate(load)
                gamma = self._gamma
                out, context, steps = self._out, self._context, self._steps
            fresh = whole if fresh_at is None else fresh_at.get(load.view.id, whole)
            if terms is not None:
                # `spares`: `join_delays`, term by term, and `_over`
                per_iter = (k2 * context + c2) * over
                first = k1 * fresh
                if (terms.ttft is not None and first > terms.ttft) or (
                    terms.itl is not None and per_iter > terms.itl
                ):
                    continue
                if terms.e2e and _over(terms, first, k1 * fresh + c1, per_iter, out):
                    continue
            harmless.append(view)
            if not own:
                continue
            # `keeps`
            ttft = wait_s + (k1 * (fresh + pending) + c1)
            if ttft_bound is not None and ttft > ttft_bound:
                continue
            avg = (ctx_sum + p + 0.5 * out) / n1
            tpot = ((k2 * avg + c2) * b + c3) * over
            if e2e_bound is not None and ttft + steps * tpot > e2e_bound:
                continue
            if itl_bound is None or tpot * 1000.0 <= itl_bound:
                meeting.append(view)
        return harmless, meeting

    def keeps(self, load: EndpointLoad) -> bool:
        req = self._req
        if self._gamma is None or load.gamma != self._gamma:
            self._estimate(load)
        c = load.coef
        n = load.n
        fresh = prefill_tokens(req, load.view.id) if self._cached else self._whole
        ttft = load.wait_s + (c.k1 * (fresh + load.pending_prompt) + c.c1)
        bound = self._ttft
        if bound is not None and ttft > bound:
            return False
        b = float(load.seats) if self._worst else float(min(n + 1, load.seats))
        avg = (load.ctx_sum + self._p + 0.5 * self._out) / (n + 1)
        tpot = ((c.k2 * avg + c.c2) * b + c.c3) * (1.0 + load.overhead)
        bound = self._e2e
        if bound is not None and ttft + self._steps * tpot > bound:
            return False
        itl = self._itl
        return itl is None or tpot * 1000.0 <= itl


#: What `Sparing.judge` reads of a load, kept on its memo: its harm terms (None: no running request
#: it could harm), its coefficients (k1, c1, k2, c2, c3), 1 + its prefill overhead, its wait for a
#: seat, its pending prompts, its running contexts summed, its running requests + 1, the batch
#: `keeps` predicts at (as a float), and its parameters' gamma.
_GuardRow = tuple[
    HarmTerms | None, float, float, float, float, float, float, float, float, float, int, float, float
]


_ROW_KEYS: dict[tuple[float, float, bool], str] = {}


def _row_key(on_track: float, margin: float, worst_case: bool) -> str:
    """The memo key of `_guard_row`'s terms for these settings: a str, whose hash is kept (a tuple's is
    computed at every lookup)."""
    got = _ROW_KEYS.get((on_track, margin, worst_case))
    if got is None:
        got = _ROW_KEYS[on_track, margin, worst_case] = f"guard-row {on_track!r} {margin!r} {worst_case}"
    return got


def _guard_row(load: EndpointLoad, on_track: float, margin: float, *, worst_case: bool) -> _GuardRow:
    """`Sparing.judge`'s terms of one load."""
    terms: HarmTerms | None = _terms(load, on_track, margin, None)
    if terms is not None and terms.ttft is None and terms.itl is None and not terms.e2e:
        terms = None
    c = load.coef
    n = load.n
    b = float(load.seats) if worst_case else float(min(n + 1, load.seats))
    return (
        terms,
        c.k1,
        c.c1,
        c.k2,
        c.c2,
        c.c3,
        1.0 + load.overhead,
        load.wait_s,
        load.pending_prompt,
        load.ctx_sum,
        n + 1,
        b,
        load.gamma,
    )


def breaks_deadlines(load: EndpointLoad, req: SchedRequest, *, theta: float, on_track: float = 0.0) -> bool:
    """Whether a running request's first- or last-token deadline harm is over its time in hand less a
    reserve of (1 − θ) of its time left: `any(h.target != "itl" and h.delay > h.saved − (1 − θ)·h.left)`
    over `load.harm(req, on_track=on_track)` (best fit's constraint (d))."""
    return _any_over(load, req, _terms(load, on_track, None, theta))
