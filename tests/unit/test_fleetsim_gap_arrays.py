"""The fleet simulator hands its token gaps over as an array of doubles (`Call.gaps`) where the live relay
hands a list: every consumer takes in the same numbers either way, and the report's gap histogram counts
them as its plain formula does."""

from __future__ import annotations

from array import array

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.telemetry.rolling import RecentWindow
from gateway.telemetry.timeline import EndpointTimeline
from loadgen.report import _GAP_BINS, _GAP_GROWTH, _GAP_LO, GapHistogram

gap = st.one_of(
    st.floats(min_value=0.0, max_value=2e3, allow_nan=False),
    st.sampled_from([0.0, 1e-9, _GAP_LO, 1e3, 1e4]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(gap, max_size=300))
def test_the_gap_histogram_is_its_plain_formula(gaps: list[float]) -> None:
    h = GapHistogram()
    h.add_many(array("d", gaps))
    values = np.maximum(np.asarray(gaps, dtype=np.float64), _GAP_LO)
    idx = np.minimum((np.log(values / _GAP_LO) / np.log(_GAP_GROWTH)).astype(np.int64), _GAP_BINS - 1)
    want = np.zeros(_GAP_BINS, dtype=np.int64)
    np.add.at(want, idx, 1)
    assert (h.counts == want).all()
    listed = GapHistogram()
    listed.add_many(gaps)
    assert (listed.counts == want).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(gap, max_size=40), max_size=12), st.integers(1, 64))
def test_windows_take_the_same_values_from_an_array(batches: list[list[float]], size: int) -> None:
    from_list, from_array = RecentWindow(size), RecentWindow(size)
    for b in batches:
        from_list.extend(b)
        from_array.extend(array("d", b))
    assert from_list.values() == from_array.values()
    assert from_list.total == from_array.total


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 1e4), st.lists(st.floats(0.0, 5.0), max_size=200))
def test_a_timeline_takes_the_same_receipts_from_an_array(first: float, gaps: list[float]) -> None:
    a, b = EndpointTimeline(), EndpointTimeline()
    for tl, g in ((a, gaps), (b, array("d", gaps))):
        tl.add_stream(dispatched_at=None, first_token_at=first, gaps=g, prompt_tokens=10, clean=True)
    plain = np.cumsum(np.concatenate(([0.0], np.asarray(gaps, dtype=np.float64)))) + first
    assert a._streams[0].times.tolist() == b._streams[0].times.tolist() == plain.tolist()
    assert sum(gaps) == sum(array("d", gaps))
