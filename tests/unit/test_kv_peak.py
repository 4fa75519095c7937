"""`KvPeak` (a set's KV peak with one more item, the set kept sorted) answers `peak_kv` of the set and the
item, bit for bit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.kv_peak import KvPeak, peak_kv

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
