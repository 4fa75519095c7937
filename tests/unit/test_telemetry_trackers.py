"""Streaming trackers, SLO attainment, engine cross-checks and KV capacity parsing: sans-IO, with
explicit times (no clock, no sleeps)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.types import SLO
from gateway.telemetry.attainment import ClassAttainment, SloAttainment, meets_slo
from gateway.telemetry.capacity import kv_capacity_tokens
from gateway.telemetry.crosscheck import CrossCheck, CumulativeDelta
from gateway.telemetry.promtext import parse
from gateway.telemetry.rolling import Ewma, LatencyTracker, RateMeter, RecentWindow

DATA = Path(__file__).parent / "data"


# --------------------------------------------------------------------- rolling
def test_ewma_is_seeded_by_the_first_value_and_ignores_non_finite() -> None:
    e = Ewma(alpha=0.5)
    seen: list[float | None] = [e.value]
    for x in (10.0, math.nan, math.inf, 20.0):
        e.add(x)
        seen.append(e.value)
    assert seen == [None, 10.0, 10.0, 10.0, 15.0]
    assert e.n == 2


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5], ids=["zero", "negative", "above-one"])
def test_ewma_rejects_a_bad_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        Ewma(alpha)


def test_recent_window_keeps_the_last_values_and_interpolates_quantiles() -> None:
    w = RecentWindow(size=5)
    assert w.quantile(0.5) is None
    for x in range(10):  # keeps 5..9
        w.add(float(x))
    assert len(w) == 5
    assert w.total == 10
    assert w.quantiles((0.0, 0.5, 1.0)) == [5.0, 7.0, 9.0]
    assert w.quantile(0.9) == pytest.approx(8.6)
    assert w.mean() == 7.0
    w.extend([100.0, 200.0])
    assert w.quantile(1.0) == 200.0
    with pytest.raises(ValueError, match="outside"):
        w.quantile(1.5)


def test_latency_tracker_summary() -> None:
    t = LatencyTracker(alpha=1.0, window=100)
    assert t.summary() == {"ewma": None, "p50": None, "p90": None, "p99": None, "n": 0}
    for x in (1.0, 2.0, 3.0):
        t.add(x)
    s = t.summary()
    assert s["ewma"] == 3.0
    assert s["p50"] == 2.0
    assert s["n"] == 3


def test_rate_meter_counts_only_the_window() -> None:
    r = RateMeter(window_s=10.0, bucket_s=1.0)
    r.add(50.0, now=100.2)
    r.add(50.0, now=105.9)
    assert r.total(106.0) == 100.0
    assert r.rate(106.0) == 10.0
    assert r.total(110.5) == 50.0  # the first bucket (second 100) left the window at 110
    assert r.total(200.0) == 0.0
    r.add(7.0, now=200.0)  # a slot reused after a full turn starts from zero
    assert r.total(200.0) == 7.0


@given(
    adds=st.lists(
        st.tuples(st.floats(0.0, 1e4), st.floats(0.0, 40.0)).map(lambda a: (a[0], round(a[1], 3))),
        max_size=60,
    ),
    reads=st.lists(st.floats(0.0, 60.0), min_size=1, max_size=5),
)
def test_rate_meter_total_is_the_sum_over_the_buckets_in_the_window(
    adds: list[tuple[float, float]], reads: list[float]
) -> None:
    """The total with every bucket in the window (its shortcut) is the bucket-by-bucket sum, bit for bit."""
    r = RateMeter(window_s=5.0, bucket_s=0.5)
    for amount, at in sorted(adds, key=lambda a: a[1]):
        r.add(amount, now=at)
    for now in reads:
        current = int(now // r.bucket_s)
        oldest = current - 10 + 1
        want = sum(a for e, a in zip(r._epochs, r._amounts, strict=True) if oldest <= e <= current)
        assert r.total(now) == want


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.floats(0.0, 1e4), st.floats(0.0, 40.0)),
            st.tuples(st.just("read"), st.just(0.0), st.floats(0.0, 60.0)),
        ),
        max_size=80,
    )
)
def test_rate_meter_total_read_again_is_the_sum_over_the_window(
    steps: list[tuple[str, float, float]],
) -> None:
    """Reads between adds, at any times (the last read kept until an add or another bucket): each is
    the bucket-by-bucket sum over its window at that moment, bit for bit."""
    r = RateMeter(window_s=5.0, bucket_s=0.5)
    for kind, amount, at in steps:
        if kind == "add":
            r.add(amount, now=at)
            continue
        for now in (at, at, at + 0.1):
            current = int(now // r.bucket_s)
            oldest = current - 10 + 1
            want = sum(a for e, a in zip(r._epochs, r._amounts, strict=True) if oldest <= e <= current)
            assert r.total(now) == want


# --------------------------------------------------------------------- attainment
@pytest.mark.parametrize(
    ("slo", "ok", "times", "met"),
    [
        pytest.param(SLO(), True, (0.5, 0.02, 3.0), True, id="default-slo-ok"),
        pytest.param(SLO(), False, (0.5, 0.02, 3.0), False, id="default-slo-failed"),
        pytest.param(SLO(ttft_ms=400), True, (0.39, None, 1.0), True, id="ttft-kept"),
        pytest.param(SLO(ttft_ms=400), True, (0.41, None, 1.0), False, id="ttft-missed"),
        pytest.param(SLO(ttft_ms=400), True, (None, None, 1.0), False, id="ttft-unmeasured"),
        pytest.param(SLO(itl_ms=50), True, (0.1, 0.04, 1.0), True, id="itl-kept"),
        pytest.param(SLO(itl_ms=50), True, (0.1, 0.06, 1.0), False, id="itl-missed"),
        pytest.param(SLO(itl_ms=50), True, (0.1, None, 1.0), True, id="itl-unmeasured-one-token"),
        pytest.param(SLO(deadline_ms=2000), True, (0.1, 0.01, 2.5), False, id="deadline-missed"),
        pytest.param(SLO(deadline_ms=2000), True, (0.1, 0.01, 1.5), True, id="deadline-kept"),
    ],
)
def test_meets_slo(slo: SLO, ok: bool, times: tuple[float | None, float | None, float], met: bool) -> None:
    ttft, itl, e2e = times
    assert meets_slo(slo, ok=ok, ttft_s=ttft, itl_s=itl, e2e_s=e2e) is met


def test_attainment_rolls_over_the_last_minute_per_class() -> None:
    a = SloAttainment(window_s=60.0, bucket_s=1.0)
    a.record("interactive", True, 1000.0)
    a.record("interactive", False, 1030.5)
    a.record("batch", True, 1059.0)
    assert a.by_class(1059.9) == {
        "batch": ClassAttainment(1, 1),
        "interactive": ClassAttainment(2, 1),
    }
    assert a.by_class(1059.9)["interactive"].ratio == 0.5
    # second 1000 leaves the window at 1060
    assert a.by_class(1060.0)["interactive"] == ClassAttainment(1, 0)
    later = a.by_class(2000.0)
    assert later["batch"].finished == 0
    assert later["batch"].ratio is None


# --------------------------------------------------------------------- cross-check
def test_cumulative_delta_handles_the_first_reading_and_resets() -> None:
    d = CumulativeDelta()
    assert d.advance(10, 5.0) is None
    assert d.advance(15, 6.5) == (5, 1.5)
    assert d.advance(3, 0.3) is None  # the engine restarted
    assert d.advance(4, 0.5) == pytest.approx((1, 0.2))
    assert d.advance(math.nan, 1.0) is None


@pytest.mark.parametrize(
    ("gw_mean", "eng_mean", "ratio", "disagrees"),
    [
        pytest.param(0.11, 0.10, 1.1, False, id="gateway-a-little-slower"),
        pytest.param(0.50, 0.10, 5.0, True, id="gateway-much-slower"),
        pytest.param(0.02, 0.10, 0.2, True, id="gateway-faster-than-engine"),
        pytest.param(0.001, 0.004, 1.0, False, id="below-the-noise-floor"),
    ],
)
def test_cross_check_verdicts(gw_mean: float, eng_mean: float, ratio: float, disagrees: bool) -> None:
    c = CrossCheck(min_samples=10, tolerance=2.0, floor_s=0.005)
    c.gateway(gw_mean * 9, 9)
    c.engine(20, eng_mean * 20)
    assert c.verdict() is None  # the gateway side has 9 < 10
    c.gateway(gw_mean, 1)
    v = c.verdict()
    assert v is not None
    assert v.ratio == pytest.approx(ratio)
    assert v.disagrees is disagrees
    assert c.last == v
    assert c.verdict() is None  # a new window started


# --------------------------------------------------------------------- KV capacity
def test_kv_capacity_of_vllm_adds_data_parallel_engines() -> None:
    expo = parse((DATA / "vllm_v1_dp2.prom").read_text())
    assert kv_capacity_tokens(expo) == 2 * 27910 * 16


def test_kv_capacity_of_sglang_counts_tensor_parallel_ranks_once() -> None:
    page = (DATA / "sglang.prom").read_text()
    assert kv_capacity_tokens(parse(page)) == 65536.0
    rank1 = 'sglang:max_total_num_tokens{model_name="m",pp_rank="0",tp_rank="1"} 65536.0'
    rank0 = rank1.replace('tp_rank="1"', 'tp_rank="0"')
    assert kv_capacity_tokens(parse(rank0 + "\n" + rank1 + "\n")) == 65536.0


@pytest.mark.parametrize(
    "page",
    [
        pytest.param("vllm:num_requests_running 1\n", id="not-exported"),
        pytest.param('vllm:cache_config_info{block_size="16",engine="0"} 1\n', id="no-block-count"),
        pytest.param('vllm:cache_config_info{block_size="x",num_gpu_blocks="8"} 1\n', id="garbage"),
        pytest.param("sglang:max_total_num_tokens 0\n", id="zero-pool"),
    ],
)
def test_kv_capacity_unknown(page: str) -> None:
    assert kv_capacity_tokens(parse(page)) is None
