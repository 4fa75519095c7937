"""The telemetry's bounded windows hold exactly what a `deque(maxlen=size)` of their values would (they
keep plain doubles, and the observation windows grow their arrays as they fill)."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from gateway.telemetry.observation_window import ObservationWindow
from gateway.telemetry.rolling import RecentWindow

_values = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
#: a batch: one value through `add` (True) or several through `extend` (False)
_batches = st.lists(st.tuples(st.booleans(), st.lists(_values, max_size=40)), max_size=40)


@given(size=st.integers(1, 70), batches=_batches)
def test_recent_window_is_a_bounded_deque(size: int, batches: list[tuple[bool, list[float]]]) -> None:
    w, ref = RecentWindow(size), deque[float](maxlen=size)
    for one, xs in batches:
        if one and xs:
            w.add(xs[0])
            ref.append(xs[0])
        else:
            w.extend(xs)
            ref.extend(xs)
        assert w.values() == list(ref)
        assert len(w) == len(ref)
        assert w.mean() == (sum(ref) / len(ref) if ref else None)
    assert w.total == sum(1 if one and xs else len(xs) for one, xs in batches)


@given(size=st.integers(1, 300), width=st.integers(1, 3), n=st.integers(0, 700), newest=st.integers(1, 400))
def test_observation_window_is_a_bounded_deque(size: int, width: int, n: int, newest: int) -> None:
    w, ref = ObservationWindow(size, width), deque[list[float]](maxlen=size)
    for i in range(n):
        row = [float(i * width + k) for k in range(width)]
        w.append(*row)
        ref.append(row)
    assert w.rows().tolist() == list(ref)
    assert w.newest(newest) == list(ref)[len(ref) - min(newest, len(ref)) :]
    assert (len(w), w.total, w.capacity) == (len(ref), n, size)
