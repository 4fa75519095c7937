"""A small batch of loads derived in Python floats (`derive_small`) gives the numbers numpy's batch
(`derive_arrays`) gives, bit for bit (hypothesis: random fleets with running requests that have
targets, progress reports, max_tokens, best effort, fitted coefficients; loads at other times; harm
keys of every on_track and margin)."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sched.load_batch import (
    SMALL_BATCH,
    Derived,
    derive,
    derive_arrays,
    derived_from,
    rows_of,
)
from gateway.sched.load_batch_small import derive_small, write_small
from gateway.sched.load_terms import pace_for
from gateway.sched.predict import PredictParams
from gateway.sched.prediction import Tail
from tests.unit.fleet_steps import ENDPOINT, NOW, Endpoint, view_of
from tests.unit.slo_fixtures import COEF

_KEYS = st.lists(
    st.tuples(st.sampled_from((0.0, 0.1, 0.5)), st.sampled_from((0.5, 0.9, 1.0))), max_size=3, unique=True
)


def _same(a: npt.NDArray[np.generic], b: npt.NDArray[np.generic]) -> bool:
    """Equal shapes and values (NaN equal to NaN; -0.0 equal to 0.0, as every comparison takes them)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == np.bool_:
        return bool(np.array_equal(a, b))
    return bool(np.array_equal(a, b, equal_nan=True))


def _check(small: Derived, arrays: Derived) -> None:
    for field in dataclasses.fields(Derived):
        if field.name in {"harms", "table"}:
            continue
        got, want = getattr(small, field.name), getattr(arrays, field.name)
        assert _same(got, want), field.name
    assert _same(small.scalars(), arrays.scalars())
    assert small.harms.keys() == arrays.harms.keys()
    for key, terms in small.harms.items():
        for got, want in zip(terms, arrays.harms[key], strict=True):
            assert _same(got, want), key


@settings(max_examples=300, deadline=None)
@given(
    endpoints=st.lists(ENDPOINT, min_size=0, max_size=8),
    before=st.lists(ENDPOINT, min_size=0, max_size=8),
    later=st.lists(st.floats(min_value=-0.5, max_value=3.0), min_size=8, max_size=8),
    keys=_KEYS,
    tail=st.sampled_from(("mean", "normal", "cantelli")),
    overhead=st.sampled_from((0.0, 0.05, 0.3)),
)
def test_small_batches_are_derived_as_numpy_derives_them(
    *,
    endpoints: list[Endpoint],
    before: list[Endpoint],
    later: list[float],
    keys: list[tuple[float, float]],
    tail: Tail,
    overhead: float,
) -> None:
    """Whatever the batch (empty loads, full ones, every request reported or not), both paths agree."""
    params = PredictParams(tail=tail, prefill_overhead=overhead)
    views = [view_of(k, e) for k, e in enumerate(endpoints)]
    views_before = [view_of(k, e) for k, e in enumerate(before)]
    loads = [
        (v, NOW + dt, pace_for(v, v.perf or COEF, params, None)) for v, dt in zip(views, later, strict=False)
    ]
    small = derived_from(derive_small(loads, params.gamma, keys), keys)
    arrays = derive_arrays(loads, params, keys)
    _check(small, arrays)
    # the rows placement over columns keeps, written row by row straight from the Python floats (over
    # rows that held other loads before: padded again past the new ones), and made from the arrays
    want_table, want_per = rows_of(arrays, keys)
    k, m = len(loads), arrays.context.shape[1]
    kinds = 3 + len(keys)
    width = max([m, *[len(v.running) for v in views_before]]) + 1
    table = np.full((k + 2, 17 + 2 * len(keys)), -1.0)
    per = np.full((kinds, k + 2, width), -1.0)
    fill = np.zeros((kinds, 1, 1))
    fill[3:] = np.inf
    per[:, :, :] = fill
    used = [0] * (k + 2)
    places = list(range(1, k + 1))[::-1]  # (rows in another order than the loads')
    earlier = [(v, NOW, pace_for(v, v.perf or COEF, params, None)) for v in views_before]
    write_small(earlier[: len(loads)], places[: len(earlier)], table, per, used, params.gamma, keys)
    write_small(loads, places, table, per, used, params.gamma, keys)
    assert _same(table[places], want_table)
    assert _same(per[:, places, :m], want_per)
    assert bool(np.all(per[:, places, m:] == fill))
    assert used == [0, *[len(v.running) for v, _, _ in loads][::-1], 0]
    # ... and what they hold: the scalars, each key's least bounds, and the per-request rows padded
    assert want_table.shape == (k, 17 + 2 * len(keys))
    assert _same(want_table[:, :17], arrays.scalars())
    assert want_per.shape == (3 + len(keys), k, m)
    assert _same(want_per[0] > 0.0, arrays.prefilled)
    assert _same(want_per[1], arrays.context)
    assert _same(want_per[2], arrays.remaining)
    for j, key in enumerate(keys):
        ttft, itl, e2e = arrays.harms[key]
        assert _same(want_table[:, 17 + 2 * j], ttft)
        assert _same(want_table[:, 18 + 2 * j], itl)
        assert _same(want_per[3 + j], e2e)


def test_derive_takes_the_python_path_below_the_small_batch_size() -> None:
    """`derive` gives the same numbers on either side of `SMALL_BATCH` (both paths are taken)."""
    params = PredictParams(tail="normal", prefill_overhead=0.05)
    run = (500, 80.0, 1.0, 2.0, 6.0, 0.05, None, None, False)
    for count in (SMALL_BATCH - 1, SMALL_BATCH):
        views = [view_of(0, (count, [run] * count, COEF))]
        loads = [(v, NOW, pace_for(v, COEF, params, None)) for v in views]
        _check(derive(loads, params, [(0.0, 1.0)]), derive_arrays(loads, params, [(0.0, 1.0)]))
