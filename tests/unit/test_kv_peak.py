"""`KvPeak` (a set's KV peak with one more item, the set kept sorted) answers `peak_kv` of the set and the
item, bit for bit; a bound clear of a capacity (`surely_under`) is never under the peak."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.kv_peak import KvPeak, peak_kv, spans, surely_under

# few distinct remaining counts, so that ties (where a stable sort puts the new item after the equal
# ones) are common
_rem = st.one_of(st.sampled_from((0.0, 0.5, 1.0, 2.0, 30.0)), st.floats(min_value=0.0, max_value=2000.0))
_item = st.tuples(st.floats(min_value=0.0, max_value=40000.0), _rem)


@settings(max_examples=500, deadline=None)
@given(
    items=st.lists(_item, max_size=40),
    extras=st.lists(_item, min_size=1, max_size=4),
    h=st.floats(min_value=0.0, max_value=4.0),
    j=st.floats(min_value=-50.0, max_value=50.0),
)
def test_the_peak_with_one_more_item_is_peak_kv_of_the_set_and_it(
    items: list[tuple[float, float]], extras: list[tuple[float, float]], h: float, j: float
) -> None:
    peak = KvPeak(items, h, j)
    for extra in extras:  # (asked again and again, as best fit asks one load for many requests)
        assert peak.with_extra(*extra) == peak_kv([*items, extra], h, j)


@settings(max_examples=1000, deadline=None)
@given(
    items=st.lists(_item, max_size=40),
    extra=_item,
    h=st.one_of(st.sampled_from((0.0, 1.0, 2.0)), st.floats(min_value=0.0, max_value=4.0)),
    j=st.one_of(st.sampled_from((0.0, -1.0, 16.0)), st.floats(min_value=-50.0, max_value=50.0)),
    over=st.sampled_from((-1e-6, -1e-12, 0.0, 1e-12, 1e-9, 2e-9, 1e-6, 0.1, 1.0)),
)
def test_a_sure_pass_of_the_kv_bound_is_a_peak_within_the_capacity(
    items: list[tuple[float, float]], extra: tuple[float, float], h: float, j: float, over: float
) -> None:
    # capacities at a hair either side of the bound and of the peak itself: a sure pass never where the
    # peak is over
    peak = peak_kv([*items, extra], h, j)
    kept = spans(items)
    bound = h * (kept + spans([extra])) + (len(items) + 1) * j
    for cap in (peak * (1.0 + over), bound * (1.0 + over), peak + over, bound + over):
        if surely_under(kept, len(items), extra, h=h, j=j, cap=cap):
            assert peak <= cap
    if h >= 0.0 and j >= 0.0:
        assert peak <= bound * (1.0 + 1e-9) + 1e-9
        # with room to spare it passes: the bound is what placement reads in most cases
        assert surely_under(kept, len(items), extra, h=h, j=j, cap=bound * 1.01 + 1.0)
