"""The per-tenant limiter (gateway.admission.limits), sans-IO on a fake clock: each limit refuses with
the seconds until its bucket has room, refills as the clock moves, takes nothing from a refused
request, corrects token charges at release, and keeps unchanged tenants' buckets across a reload."""

from __future__ import annotations

import pytest

from gateway.admission.limits import Limit, Refusal, Seat, TenantLimiter, TenantLimits, TokenBucket
from gateway.admission.slo import Tenant
from gateway.admission.tenancy import TenantAccounting, charge_of
from gateway.core.errors import BerthError
from gateway.core.types import SLO, ApiKind, ModelName, RequestId
from gateway.sched.request import SchedRequest


def _limiter(now: float = 0.0, **limits: TenantLimits) -> TenantLimiter:
    lim = TenantLimiter()
    lim.configure(limits, now)
    return lim


def _seat(got: Seat | Refusal) -> Seat:
    assert isinstance(got, Seat), got
    return got


def _refusal(got: Seat | Refusal) -> Refusal:
    assert isinstance(got, Refusal), got
    return got


def test_requests_per_s_refuses_past_the_burst_and_refills() -> None:
    lim = _limiter(a=TenantLimits(requests_per_s=2.0))
    for _ in range(2):  # burst: one second's worth
        _seat(lim.admit("a", 0, 0.0))
    r = _refusal(lim.admit("a", 0, 0.0))
    assert r.limit is Limit.REQUESTS
    assert r.retry_after_s == pytest.approx(0.5)
    _refusal(lim.admit("a", 0, 0.4))  # 0.8 of a request: not yet
    _seat(lim.admit("a", 0, 0.5))


def test_a_slow_rate_still_admits_one_request() -> None:
    lim = _limiter(a=TenantLimits(requests_per_s=0.1))
    _seat(lim.admit("a", 0, 0.0))
    r = _refusal(lim.admit("a", 0, 1.0))
    assert r.retry_after_s == pytest.approx(9.0)
    _seat(lim.admit("a", 0, 10.0))


def test_tokens_per_min_charges_and_refills() -> None:
    lim = _limiter(a=TenantLimits(tokens_per_min=600))  # 10 tokens/s, holds 600
    s1 = _seat(lim.admit("a", 500, 0.0))
    assert s1.charged_tokens == 500
    r = _refusal(lim.admit("a", 200, 0.0))  # 100 left, 200 wanted: 10 s
    assert r.limit is Limit.TOKENS
    assert r.retry_after_s == pytest.approx(10.0)
    _seat(lim.admit("a", 200, 10.0))


def test_a_charge_larger_than_the_bucket_needs_a_full_bucket_and_leaves_a_debt() -> None:
    lim = _limiter(a=TenantLimits(tokens_per_min=60))  # 1 token/s, holds 60
    _seat(lim.admit("a", 120, 0.0))
    assert lim.level("a", Limit.TOKENS, 0.0) == pytest.approx(-60.0)
    r = _refusal(lim.admit("a", 1, 0.0))
    assert r.retry_after_s == pytest.approx(61.0)


def test_release_corrects_the_token_charge_with_the_real_usage() -> None:
    lim = _limiter(a=TenantLimits(tokens_per_min=600))
    seat = _seat(lim.admit("a", 500, 0.0))
    lim.release(seat, 100, 0.0)  # used 100 of the 500 charged: 400 back
    assert lim.level("a", Limit.TOKENS, 0.0) == pytest.approx(500.0)
    seat2 = _seat(lim.admit("a", 100, 0.0))
    lim.release(seat2, 300, 0.0)  # used 200 more than charged: taken now
    assert lim.level("a", Limit.TOKENS, 0.0) == pytest.approx(200.0)
    seat3 = _seat(lim.admit("a", 100, 0.0))
    lim.release(seat3, None, 0.0)  # unknown usage: the charge stays
    assert lim.level("a", Limit.TOKENS, 0.0) == pytest.approx(100.0)


def test_max_concurrency_counts_seats_and_release_is_idempotent() -> None:
    lim = _limiter(a=TenantLimits(max_concurrency=2))
    s1 = _seat(lim.admit("a", 0, 0.0))
    _seat(lim.admit("a", 0, 0.0))
    r = _refusal(lim.admit("a", 0, 100.0))
    assert (r.limit, r.retry_after_s) == (Limit.CONCURRENCY, None)
    lim.release(s1, None, 1.0)
    lim.release(s1, None, 1.0)  # twice: one seat back only
    assert lim.inflight("a") == 1
    _seat(lim.admit("a", 0, 1.0))
    _refusal(lim.admit("a", 0, 1.0))


def test_a_refused_request_takes_nothing() -> None:
    lim = _limiter(a=TenantLimits(requests_per_s=1.0, tokens_per_min=60, max_concurrency=5))
    _seat(lim.admit("a", 60, 0.0))  # drains both buckets
    assert _refusal(lim.admit("a", 10, 0.5)).limit is Limit.REQUESTS
    assert lim.inflight("a") == 1
    # a second later the request bucket has room but tokens do not: refused by tokens, request not taken
    assert _refusal(lim.admit("a", 10, 1.0)).limit is Limit.TOKENS
    assert lim.level("a", Limit.REQUESTS, 1.0) == pytest.approx(1.0)


def test_tenants_without_limits_and_unknown_tenants_always_pass() -> None:
    lim = _limiter(a=TenantLimits())
    for _ in range(100):
        seat = _seat(lim.admit("a", 10**9, 0.0))
        _seat(lim.admit("nobody", 10**9, 0.0))
    lim.release(seat, 5, 0.0)
    assert lim.inflight("a") == 0


def test_reload_keeps_unchanged_tenants_buckets_and_seats() -> None:
    lim = _limiter(a=TenantLimits(requests_per_s=1.0), b=TenantLimits(max_concurrency=1))
    _seat(lim.admit("a", 0, 0.0))
    b_seat = _seat(lim.admit("b", 0, 0.0))
    lim.configure({"a": TenantLimits(requests_per_s=1.0), "b": TenantLimits(max_concurrency=1)}, 0.1)
    assert _refusal(lim.admit("a", 0, 0.1)).limit is Limit.REQUESTS  # not reset by the reload
    assert _refusal(lim.admit("b", 0, 0.1)).limit is Limit.CONCURRENCY
    # a changed tenant keeps its seats in flight: its seat released after the change frees the new count
    lim.configure({"a": TenantLimits(requests_per_s=1.0), "b": TenantLimits(max_concurrency=2)}, 0.2)
    _seat(lim.admit("b", 0, 0.2))
    _refusal(lim.admit("b", 0, 0.2))
    lim.release(b_seat, None, 0.3)
    _seat(lim.admit("b", 0, 0.3))


def test_a_changed_bucket_keeps_its_level_capped_by_the_new_size() -> None:
    lim = _limiter(a=TenantLimits(tokens_per_min=600))
    _seat(lim.admit("a", 100, 0.0))
    lim.configure({"a": TenantLimits(tokens_per_min=300)}, 0.0)
    assert lim.level("a", Limit.TOKENS, 0.0) == pytest.approx(300.0)
    lim.configure({"a": TenantLimits(tokens_per_min=6000)}, 0.0)
    assert lim.level("a", Limit.TOKENS, 0.0) == pytest.approx(300.0)


def test_token_bucket_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(0.0, 1.0, 0.0)


def _sreq(prompt: int, max_tokens: int | None, predicted: float | None = None) -> SchedRequest:
    return SchedRequest(
        id=RequestId("b1"),
        model=ModelName("m"),
        api=ApiKind.CHAT,
        stream=False,
        arrival=0.0,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        slo=SLO(slo_class="chat"),
        predicted_output_tokens=predicted,
    )


def test_the_charge_is_the_prompt_plus_max_tokens_or_the_predicted_output() -> None:
    assert charge_of(_sreq(100, 50)) == 150
    assert charge_of(_sreq(100, None, 30.2)) == 131
    assert charge_of(_sreq(100, None)) == 100


def test_accounting_answers_429_with_retry_after_rounded_up_and_refunds_undispatched() -> None:
    acc = TenantAccounting(retry_after_s=2.0)
    t = Tenant("a", limits=TenantLimits(requests_per_s=0.4, tokens_per_min=1000, max_concurrency=1))
    acc.configure({"a": t}, 0.0, retry_after_s=2.0)
    seat = acc.admit(t, _sreq(100, 100), 0.0)
    assert seat is not None
    with pytest.raises(BerthError) as e:
        acc.admit(t, _sreq(1, 1), 0.0)
    assert (e.value.status, e.value.code, e.value.headers()) == (429, "rate_limited", {"Retry-After": "2"})
    acc.finish("a", seat, "ok", dispatched=False, prompt_tokens=None, completion_tokens=0, now=0.0)
    assert acc.limiter.level("a", Limit.TOKENS, 0.0) == pytest.approx(1000.0)  # all 200 back
    with pytest.raises(BerthError) as e:
        acc.admit(t, _sreq(1, 1), 1.0)  # 0.4 of a request after 1 s: 1.5 s more, rounded up
    assert e.value.headers() == {"Retry-After": "2"}
    assert acc.rate_limited == {("a", "max_concurrency"): 1, ("a", "requests_per_s"): 1}
    assert acc.requests == {("a", "ok"): 1}
    assert acc.admit(None, _sreq(1, 1), 0.0) is None  # anonymous: no limits
