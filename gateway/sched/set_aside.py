"""Setting aside what the next plugin of a placement pipeline surely rejects.

A filter whose judgement is costly (`SetAsideFilter`: the overflow guard makes and judges each
candidate's load) is told which candidates the plugin after it is sure to reject (`SureRejects`: best
fit's sure misses), and judges only the rest, and those set aside only as far as its answer for the rest
needs. The choice is the same as without (each contract says why; `tests/unit/test_sched_set_aside.py`
pins whole pipelines with and without). The profile resolves the pairs once, when it is built
(`asides`, `column_asides`), and runs each step through `set_aside` or `set_aside_columns`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from gateway.sched.interfaces import (
    ColumnarSetAsideFilter,
    ColumnarSureRejects,
    Filter,
    Picker,
    SetAsideFilter,
    SureRejects,
    TieredFilter,
)
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot

_Mask = npt.NDArray[np.bool_]
_Views = Sequence[EndpointView]
#: The next plugin's `sure_rejects` and the filter's `filter_aside`.
Aside = tuple[
    Callable[[SchedRequest, _Views, FleetSnapshot], Sequence[bool]],
    Callable[[SchedRequest, _Views, _Views, FleetSnapshot], _Views],
]
_ColumnMask = Callable[[SchedRequest, FleetColumns, _Mask, FleetSnapshot], _Mask]
#: A filter's columnar step: its mask, or the few it keeps as views (`ColumnarFewFilter`).
ColumnStep = Callable[[SchedRequest, FleetColumns, _Mask, FleetSnapshot], _Mask | list[EndpointView]]
#: The same over columns (`sure_rejects_columns`, `filter_columns_aside`).
ColumnAside = tuple[_ColumnMask, Callable[[SchedRequest, FleetColumns, _Mask, _Mask, FleetSnapshot], _Mask]]


def _pairs(
    filters: Sequence[Filter], scorers: Sequence[object], picker: Picker, *, on: bool
) -> list[tuple[Filter, object]]:
    """Each filter with the plugin after it whose sure rejects it may set aside: the next filter; after
    the last, the picker when no scorer comes between (scores may depend on every candidate). None
    where the profile does not set aside (`on`), or a tiered filter (its tiers are not set aside)."""
    if not on or not filters:
        return [(f, None) for f in filters]
    nexts: list[object] = [*filters[1:], None if scorers else picker]
    return [(f, None if isinstance(f, TieredFilter) else n) for f, n in zip(filters, nexts, strict=True)]


def asides(
    filters: Sequence[Filter], scorers: Sequence[object], picker: Picker, *, on: bool
) -> tuple[Aside | None, ...]:
    """Per filter, in order: what it sets aside and how (`Aside`), or None."""
    return tuple(
        (nxt.sure_rejects, f.filter_aside)
        if isinstance(f, SetAsideFilter) and isinstance(nxt, SureRejects)
        else None
        for f, nxt in _pairs(filters, scorers, picker, on=on)
    )


def column_asides(
    filters: Sequence[Filter], scorers: Sequence[object], picker: Picker, *, on: bool
) -> tuple[ColumnAside | None, ...]:
    """`asides` over columns (both plugins with their columnar forms)."""
    return tuple(
        (nxt.sure_rejects_columns, f.filter_columns_aside)
        if isinstance(f, ColumnarSetAsideFilter) and isinstance(nxt, ColumnarSureRejects)
        else None
        for f, nxt in _pairs(filters, scorers, picker, on=on)
    )


def set_aside(req: SchedRequest, f: Filter, aside: Aside, candidates: _Views, snap: FleetSnapshot) -> _Views:
    """`f.filter(req, candidates, snap)` less what the next plugin surely rejects, which then never sees
    those (it would reject them anyway: `SureRejects`): `f` judges them only as far as its answer for
    the others needs (its `filter_aside`, `SetAsideFilter`)."""
    rejects, filter_aside = aside
    flags = rejects(req, candidates, snap)
    if not any(flags):
        return f.filter(req, candidates, snap)
    kept = [e for e, no in zip(candidates, flags, strict=True) if not no]
    return filter_aside(req, kept, [e for e, no in zip(candidates, flags, strict=True) if no], snap)


def set_aside_columns(  # noqa: PLR0917 (the columnar step's arguments, with what it sets aside)
    req: SchedRequest,
    one: ColumnStep,
    aside: ColumnAside,
    cols: FleetColumns,
    mask: _Mask,
    snap: FleetSnapshot,
) -> _Mask | list[EndpointView]:
    """`set_aside` over columns: `one` is the filter's `filter_columns` (or `filter_columns_few`: with
    nothing set aside, its answer as it gives it)."""
    rejects, filter_aside = aside
    named = rejects(req, cols, mask, snap)
    if not np.count_nonzero(named):
        return one(req, cols, mask, snap)
    return filter_aside(req, cols, mask & ~named, mask & named, snap)
