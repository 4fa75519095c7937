"""Cached prompt tokens inside the SLO model: predictions charge prefill on the uncached tokens only,
and placement keeps a request with its prefix exactly while waiting there costs less than the prefill
the cache saves."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import EndpointId, RequestId
from gateway.sched.plugins.placement.best_fit import BestFitFilter, BestFitParams
from gateway.sched.plugins.placement.cato_slack import CatoSlackParams, CatoSlackPicker
from gateway.sched.plugins.placement.demand_split import request_work
from gateway.sched.plugins.placement.prefix_affinity import PrefixAffinityParams, PrefixAffinityScorer
from gateway.sched.plugins.placement.prefix_holders import PrefixHoldersFilter, PrefixHoldersParams
from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.prefix import NO_HITS, PrefixHits, uncached
from gateway.sched.request import SchedRequest
from gateway.sched.running import prefill_tokens, running_from
from gateway.sched.snapshot import FleetSnapshot
from tests.unit.slo_fixtures import COEF, req, running, snap, view

P = PredictParams()
A, B = EndpointId("a"), EndpointId("b")


def cached_req(prompt: int, on_a: int, **kw: object) -> SchedRequest:
    return dataclasses.replace(req(prompt=prompt, **kw), cached=PrefixHits({A: on_a}))  # type: ignore[arg-type]


def test_prefix_hits_are_a_read_only_value() -> None:
    h = PrefixHits({A: 10, B: 0})
    assert dict(h) == {A: 10}
    assert h.get_tokens(B) == 0
    assert h == PrefixHits({A: 10})
    assert hash(h) == hash(PrefixHits({A: 10}))
    assert h.best == 10
    assert not NO_HITS
    assert NO_HITS.best == 0


@pytest.mark.parametrize(
    ("prompt", "cached", "fresh"),
    [(100, 0, 100), (100, 40, 60), (100, 100, 1), (100, 500, 1), (0, 0, 0)],
    ids=["none", "part", "full hit recomputes one", "over", "empty"],
)
def test_uncached(prompt: int, cached: int, fresh: int) -> None:
    assert uncached(prompt, cached) == fresh


def test_the_prediction_charges_prefill_on_the_uncached_tokens_only() -> None:
    r = cached_req(10_000, 8_000)
    a, b = EndpointLoad(view("a"), 0.0, P), EndpointLoad(view("b"), 0.0, P)
    assert prefill_tokens(r, A) == 2_000
    assert a.predict(r).ttft_s == pytest.approx(COEF.prefill_s(2_000))
    assert b.predict(r).ttft_s == pytest.approx(COEF.prefill_s(10_000))
    assert a.idle_service(r).ttft_s == pytest.approx(COEF.prefill_s(2_000))
    assert a.predict_after(r, 1.0).ttft_s == pytest.approx(1.0 + COEF.prefill_s(2_000))
    idle_ttft, _, ttft, _ = a.times(10_000.0, 50.0, float(prefill_tokens(r, A)))
    assert idle_ttft == pytest.approx(COEF.prefill_s(2_000))
    assert ttft == pytest.approx(a.predict(r).ttft_s)
    # decode still sees the whole context
    assert a.predict(r).tpot_s == pytest.approx(b.predict(r).tpot_s)
    # what it pauses running requests for is its own prefill of the uncached tokens
    busy = EndpointLoad(view("a", runs=[running("x", e2e_deadline=100.0)]), 0.0, P)
    assert (
        busy.harm(r)[0].delay
        < EndpointLoad(view("b", runs=[running("x", e2e_deadline=100.0)]), 0.0, P)
        .harm(dataclasses.replace(r, cached=NO_HITS))[0]
        .delay
    )


def test_a_running_request_with_a_cached_prefix_holds_up_less_pending_prefill() -> None:
    r = cached_req(10_000, 8_000)
    placed = running_from(r, 0.0, A)
    assert placed.cached_tokens == 8_000
    assert placed.prefill_tokens == 2_000
    assert placed.prompt_tokens == 10_000  # the context is the whole prompt
    load = EndpointLoad(view("a", runs=[placed]), 0.0, P)
    assert load.pending_prompt == 2_000
    assert running_from(r, 0.0, B).cached_tokens == 0


def test_demand_split_counts_the_prefill_saved_where_the_prefix_is_held() -> None:
    r = cached_req(10_000, 8_000)
    plain = dataclasses.replace(r, cached=NO_HITS)
    saved = request_work(plain, COEF, 8) - request_work(r, COEF, 8)
    assert saved == pytest.approx(COEF.k1 * 8_000)


def _busy_holder(pending: int) -> FleetSnapshot:
    """Endpoint a (holding 8,000 of the request's 10,000 tokens) with `pending` prompt tokens of two
    requests dispatched just now, still to be prefilled; endpoint b idle."""
    runs = [running(f"x{i}", dispatched_at=0.0, prompt=pending // 2) for i in range(2)]
    return snap(view("a", runs=runs), view("b"))


@pytest.mark.parametrize(
    ("pending", "chosen"),
    [(4_000, "a"), (12_000, "b")],
    ids=["waiting costs less than the prefill saved: stay", "waiting costs more: spread"],
)
def test_placement_stays_with_the_prefix_exactly_while_it_pays(pending: int, chosen: str) -> None:
    s = _busy_holder(pending)
    r = cached_req(10_000, 8_000)
    a, b = s.endpoints
    la, lb = EndpointLoad(a, 0.0, P), EndpointLoad(b, 0.0, P)
    # the rule in the prediction's own terms: a's wait for the pending prefills against the 0.8 s saved
    assert (la.predict(r).ttft_s < lb.predict(r).ttft_s) == (chosen == "a")
    picker = CatoSlackPicker(CatoSlackParams())
    assert picker.pick(r, [(a, 0.0), (b, 0.0)], s).id == chosen
    # prefix-holders weighing the request's own first token alone (no charge for the fleet's time)
    kept = PrefixHoldersFilter(PrefixHoldersParams(miss_charge=0.0)).filter(r, [a, b], s)
    assert [v.id for v in kept] == (["a"] if chosen == "a" else ["a", "b"])  # else: all, for the rest
    for order in ("least-loaded", "least-outstanding"):  # (most-loaded packs onto a either way)
        bf = BestFitFilter(BestFitParams(order=order))
        assert [v.id for v in bf.filter(r, [a, b], s)] == [chosen], order


@pytest.mark.parametrize(
    ("pending", "kept"),
    [(4_000, ["a"]), (12_000, ["a"]), (24_000, ["a", "b"])],
    ids=["faster there: stay", "slower there by less than the fleet's saving: stay", "far slower: spread"],
)
def test_prefix_holders_charges_a_miss_the_prefill_it_redoes(pending: int, kept: list[str]) -> None:
    # A miss redoes the cached prefill on another endpoint: engine time every request queued behind it
    # waits for. By default the holder keeps the request while its first token, less that time
    # (k1 x the cached tokens), comes before the other endpoint's.
    s = _busy_holder(pending)
    r = cached_req(10_000, 8_000)
    a, b = s.endpoints
    la, lb = EndpointLoad(a, 0.0, P), EndpointLoad(b, 0.0, P)
    saved = la.coef.k1 * 8_000
    assert (la.predict(r).ttft_s - saved < lb.predict(r).ttft_s) == (kept == ["a"])
    got = PrefixHoldersFilter(PrefixHoldersParams()).filter(r, [a, b], s)
    assert [v.id for v in got] == kept


def test_without_a_cached_prefix_placement_is_unchanged() -> None:
    s = _busy_holder(4_000)
    a, b = s.endpoints
    r = req(prompt=10_000)
    bf = BestFitFilter(BestFitParams(order="least-loaded"))
    assert [v.id for v in bf.filter(r, [a, b], s)] == ["b"]
    assert r.cached is NO_HITS
    assert RequestId("r") == r.id


@pytest.mark.parametrize(
    ("cached_a", "inflight_b", "scores"),
    [
        (8_000, 0, [0.8, 0.0]),  # balanced, share above the threshold: the prefix decides
        (2_000, 0, [0.0, 0.0]),  # below cache_threshold: the load scorer decides
        (8_000, 100, [0.0, 0.0]),  # imbalanced (by > 64 and > 1.5x): the load scorer decides
    ],
    ids=["follows the prefix", "too little cached", "imbalanced"],
)
def test_prefix_affinity_is_the_peers_rule(cached_a: int, inflight_b: int, scores: list[float]) -> None:
    scorer = PrefixAffinityScorer(PrefixAffinityParams())
    a = view("a")
    b = dataclasses.replace(view("b"), inflight=inflight_b)
    r = cached_req(10_000, cached_a)
    assert scorer.score(r, [a, b], snap(a, b)) == pytest.approx(scores)
    assert scorer.score(req(prompt=10_000), [a, b], snap(a, b)) == [0.0, 0.0]


@settings(max_examples=80, deadline=None)
@given(
    prompt=st.integers(1, 20_000),
    share=st.floats(0.0, 1.0),
    running_prompts=st.lists(st.integers(1, 8_000), max_size=6),
    running_cached=st.floats(0.0, 1.0),
)
def test_a_cached_prefix_never_makes_a_prediction_later(
    prompt: int, share: float, running_prompts: list[int], running_cached: float
) -> None:
    """More cached tokens, here or in the requests already running, never predict a later first or last
    token; the decode side is unchanged."""
    runs = [
        dataclasses.replace(running(f"x{i}", prompt=p), cached_tokens=int(p * running_cached))
        for i, p in enumerate(running_prompts)
    ]
    cold_runs = [dataclasses.replace(r, cached_tokens=0) for r in runs]
    warm = EndpointLoad(view("a", runs=runs), 0.0, P)
    cold = EndpointLoad(view("a", runs=cold_runs), 0.0, P)
    r = cached_req(prompt, int(prompt * share))
    plain = dataclasses.replace(r, cached=NO_HITS)
    for load in (warm, cold):
        hit, miss = load.predict(r), load.predict(plain)
        assert hit.ttft_s <= miss.ttft_s + 1e-12
        assert hit.e2e_s <= miss.e2e_s + 1e-12
        assert load.idle_service(r).ttft_s <= load.idle_service(plain).ttft_s + 1e-12
    assert warm.predict(plain).ttft_s <= cold.predict(plain).ttft_s + 1e-12


def test_a_shorter_holder_gives_way_to_a_longer_one_that_is_as_soon() -> None:
    # Both idle: b holds a quarter of what a holds, so placing there redoes the difference; a alone is
    # kept (the older rule kept every holder beating the non-holders, and the load scorer chose).
    a, b, c = view("a"), view("b"), view("c")
    r = dataclasses.replace(req(prompt=10_000), cached=PrefixHits({A: 8_000, B: 2_000}))
    got = PrefixHoldersFilter(PrefixHoldersParams()).filter(r, [a, b, c], snap(a, b, c))
    assert [v.id for v in got] == ["a"]
    # equal holders are all kept, for the scorers to choose among
    r2 = dataclasses.replace(r, cached=PrefixHits({A: 8_000, B: 8_000}))
    got2 = PrefixHoldersFilter(PrefixHoldersParams()).filter(r2, [a, b, c], snap(a, b, c))
    assert [v.id for v in got2] == ["a", "b"]


@pytest.mark.parametrize(
    ("out", "waits"),
    [(5.0, True), (5_000.0, False)],
    ids=["its seat frees soon: wait for it", "its seat frees late: go elsewhere"],
)
def test_a_holder_with_no_free_seat_is_waited_for_while_that_pays(out: float, waits: bool) -> None:
    # a holds 8,000 of the 10,000 tokens but every seat under its cap is taken (not a candidate); b is
    # idle. The request waits (the filter keeps nothing) exactly while a's charged first token, its wait
    # for the first seat to free included, beats b's.
    runs = [running(f"x{i}", prompt=100, out=out) for i in range(2)]
    a, b = view("a", cap=2, runs=runs), view("b")
    s = snap(a, b)
    r = cached_req(10_000, 8_000)
    la, lb = EndpointLoad(a, 0.0, P), EndpointLoad(b, 0.0, P)
    charged = la.predict(r).ttft_s - la.coef.k1 * 8_000
    assert (charged < lb.predict(r).ttft_s) == waits
    got = PrefixHoldersFilter(PrefixHoldersParams()).filter(r, [b], s)
    assert [v.id for v in got] == ([] if waits else ["b"])
