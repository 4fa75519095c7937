"""The placement pipeline: filters -> weighted scorers -> picker, and the Policy that bundles it.

The runner enforces the plugin contracts: a scorer's values are clamped into [0, 1] (NaN counts 0)
and weighted by the profile, and a picker that returns something other than a candidate is a bug that
raises.

It is a little over the size rule on purpose: each step's plain and columnar forms sit side by side, so
that a change to one is seen beside the other (both must choose alike).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_
from typing import Final, Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from gateway.core.slo import SloPolicy, default_slo_policy
from gateway.core.types import EndpointHealth, EndpointId, ModelName
from gateway.sched.autoscale import Autoscale
from gateway.sched.cuts import Cuts
from gateway.sched.interfaces import (
    Admitter,
    ColumnarFewFilter,
    ColumnarFilter,
    ColumnarPicker,
    ColumnarScopedFilter,
    ColumnarScorer,
    ColumnarTieredFilter,
    ConcurrencyController,
    EnginePriority,
    Filter,
    GroupingFilter,
    Ordering,
    Picker,
    Preemptor,
    ScopedFilter,
    Scorer,
    TieredFilter,
)
from gateway.sched.loads import LoadCaches
from gateway.sched.request import SchedRequest
from gateway.sched.set_aside import (
    Aside,
    ColumnAside,
    ColumnStep,
    asides,
    column_asides,
    set_aside,
    set_aside_columns,
)
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


def eligible(
    req: SchedRequest, snap: FleetSnapshot, among: Sequence[EndpointView] | None = None
) -> list[EndpointView]:
    """Endpoints (of `among`, a part of the snapshot's; default all of them) that serve the model (or the
    one it is pinned to), are not unhealthy or starting, and have room under their cap."""
    model, ready = req.model, EndpointHealth.READY
    endpoints = snap.endpoints if among is None else among
    # `inflight < cap` is EndpointView.has_room, spelled out: this runs for every endpoint per placement.
    if req.pinned is not None:
        pinned = req.pinned
        return [
            e
            for e in endpoints
            if e.id == pinned and model in e.models and e.health is ready and e.inflight < e.cap
        ]
    return [e for e in endpoints if model in e.models and e.health is ready and e.inflight < e.cap]


_Mask = npt.NDArray[np.bool_]
_ColumnTiers = Callable[[SchedRequest, FleetColumns, _Mask, FleetSnapshot], Sequence[_Mask]]
_ColumnScope = Callable[[SchedRequest, FleetColumns, _Mask, FleetSnapshot], _Mask]
_Tiers = Callable[[SchedRequest, Sequence[EndpointView], FleetSnapshot], Sequence[Sequence[EndpointView]]]
_Scope = Callable[[SchedRequest, Sequence[EndpointView], FleetSnapshot], Sequence[EndpointView]]


#: Placements with at least this many candidates go over columns when the profile can (numpy's fixed
#: cost per call is more than a Python step per endpoint below it: `overhead_micro` fleet_N) ...
COLUMNS_FROM: Final = 128


@runtime_checkable
class ColumnsFrom(Protocol):
    """A plugin whose columnar form pays from fewer candidates than `COLUMNS_FROM` (one that derives
    each endpoint's load in its plain form): the least candidates at which it does."""

    columns_from: int


@dataclass(frozen=True, slots=True)
class SchedulerProfile:
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker
    # Placements with at least this many candidates (eligible endpoints) go over columns when a
    # snapshot carries them; None: the least its plugins name (`ColumnsFrom`), else `COLUMNS_FROM`.
    columns_from: int | None = None
    # Whether a filter that can set candidates aside (`SetAsideFilter`) is told the next plugin's sure
    # rejects (`SureRejects`); off, the pipeline runs as if no plugin offered them (the same choices).
    set_aside: bool = True
    _columns_from: int = field(init=False, repr=False, compare=False)  # (as resolved)
    # The filters' optional capabilities, resolved once here rather than per placement:
    # each filter's `tiers` method (`TieredFilter`), or None for a plain filter, in filter order;
    _tiers: tuple[_Tiers | None, ...] = field(init=False, repr=False, compare=False)
    # per filter, in filter order: the next plugin's `sure_rejects` (`SureRejects`) and the filter's
    # `filter_aside` when it can set them aside (`SetAsideFilter`), else None;
    _asides: tuple[Aside | None, ...] = field(init=False, repr=False, compare=False)
    # the `scope` method of each scoped filter (`ScopedFilter`), in filter order;
    _scopes: tuple[_Scope, ...] = field(init=False, repr=False, compare=False)
    # their columnar forms (`ColumnarScopedFilter.scope_columns`), when every scoped filter has one;
    _column_scopes: tuple[_ColumnScope, ...] | None = field(init=False, repr=False, compare=False)
    # the grouping filters (`GroupingFilter`), in filter order;
    _groupings: tuple[GroupingFilter, ...] = field(init=False, repr=False, compare=False)
    # when every filter, scorer and the picker has a columnar form (`ColumnarFilter`, ...), those forms
    # (the filters', the weighted scorers', the picker's); None otherwise. The profile then places over
    # the fleet's columns when a snapshot carries them.
    _columnar: tuple[tuple[Filter, ...], tuple[tuple[ColumnarScorer, float], ...], ColumnarPicker] | None = (
        field(init=False, repr=False, compare=False)
    )
    # per filter, in filter order: its columnar tiers (`ColumnarTieredFilter.tiers_columns`) or its
    # columnar mask (`ColumnarFilter.filter_columns`; `ColumnarFewFilter.filter_columns_few` where it
    # may answer with views), when the profile is columnar
    _column_steps: tuple[tuple[_ColumnTiers | None, ColumnStep | None], ...] = field(
        init=False, repr=False, compare=False
    )
    # per filter, in filter order, when the profile is columnar: `_asides`' columnar forms
    # (`ColumnarSureRejects.sure_rejects_columns`, `ColumnarSetAsideFilter.filter_columns_aside`)
    _column_asides: tuple[ColumnAside | None, ...] = field(init=False, repr=False, compare=False)
    # the parts of the last snapshot `scope` cut, by what they kept: one object per part, so what is
    # kept per snapshot's views downstream (SLO admission's endpoint order and bounds) is kept across
    # the requests of a tick that reach the same part
    _cuts: Cuts = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        filters = self.filters
        object.__setattr__(self, "_cuts", Cuts())
        object.__setattr__(
            self, "_tiers", tuple(f.tiers if isinstance(f, TieredFilter) else None for f in filters)
        )
        object.__setattr__(
            self, "_asides", asides(self.filters, self.scorers, self.picker, on=self.set_aside)
        )
        object.__setattr__(self, "_scopes", tuple(f.scope for f in filters if isinstance(f, ScopedFilter)))
        scoped = [f for f in filters if isinstance(f, ScopedFilter)]
        object.__setattr__(
            self,
            "_column_scopes",
            tuple(f.scope_columns for f in scoped if isinstance(f, ColumnarScopedFilter))
            if all(isinstance(f, ColumnarScopedFilter) for f in scoped)
            else None,
        )
        object.__setattr__(self, "_groupings", tuple(f for f in filters if isinstance(f, GroupingFilter)))
        # a tiered filter's columnar form is its tiers' (`ColumnarTieredFilter`); a plain one's its mask's
        cfilters = [
            f
            for f in filters
            if isinstance(f, ColumnarTieredFilter)
            or (isinstance(f, ColumnarFilter) and not isinstance(f, TieredFilter))
        ]
        cscorers = [(ws.scorer, ws.weight) for ws in self.scorers if isinstance(ws.scorer, ColumnarScorer)]
        picker = self.picker
        columnar = None
        if (
            len(cfilters) == len(filters)
            and len(cscorers) == len(self.scorers)
            and isinstance(picker, ColumnarPicker)
        ):
            columnar = (tuple(cfilters), tuple(cscorers), picker)
        object.__setattr__(self, "_columnar", columnar)
        plugins = [*filters, *(ws.scorer for ws in self.scorers), picker]
        least = min([p.columns_from for p in plugins if isinstance(p, ColumnsFrom)], default=COLUMNS_FROM)
        object.__setattr__(self, "_columns_from", least if self.columns_from is None else self.columns_from)
        steps: list[tuple[_ColumnTiers | None, ColumnStep | None]] = []
        if columnar is not None:
            for f in filters:
                if isinstance(f, ColumnarTieredFilter):
                    steps.append((f.tiers_columns, None))
                elif isinstance(f, ColumnarFewFilter):
                    steps.append((None, f.filter_columns_few))
                else:
                    steps.append((None, cast("ColumnarFilter", f).filter_columns))
        object.__setattr__(self, "_column_steps", tuple(steps))
        object.__setattr__(
            self,
            "_column_asides",
            column_asides(filters, self.scorers, picker, on=self.set_aside) if columnar else (),
        )

    @property
    def columnar(self) -> bool:
        """Whether the profile places over columns when a snapshot carries them."""
        return self._columnar is not None

    @property
    def columns_least(self) -> int:
        """The least candidates a placement goes over columns for (a fleet smaller than this needs no
        columns)."""
        return self._columns_from

    def groups(self, model: ModelName) -> dict[str, tuple[float | None, list[EndpointId]]]:
        """The endpoint groups of the grouping filters (`GroupingFilter`) for `model`: name -> (share of
        demand, endpoints now). Empty without a grouping filter."""
        out: dict[str, tuple[float | None, list[EndpointId]]] = {}
        for f in self._groupings:
            out.update(f.groups(model))
        return out

    def scope(self, req: SchedRequest, snap: FleetSnapshot) -> FleetSnapshot:
        """`snap` with the request's model's endpoints cut to those the scoped filters let it reach
        (`ScopedFilter`); `snap` itself when no filter is scoped."""
        if not self._scopes:
            return snap
        model = req.model
        cols, column_scopes = snap.columns, self._column_scopes
        if cols is not None and column_scopes is not None and cols.endpoints is snap.endpoints:
            return self._scope_columns(req, snap, cols, column_scopes)
        cuts = self._cuts.of(snap)
        serving = self._cuts.serving(model, snap)
        reach: Sequence[EndpointView] = serving
        for scope in self._scopes:
            reach = scope(req, reach, snap)
        if len(reach) == len(serving):
            return snap  # nothing cut (a scope only ever keeps a subset)
        ids = tuple(e.id for e in reach)
        key = (model, ids)
        got = cuts.get(key)
        if got is None:
            keep = set(ids)
            got = cuts[key] = dataclasses.replace(
                snap, endpoints=tuple(e for e in snap.endpoints if model not in e.models or e.id in keep)
            )
        return got

    def _scope_columns(
        self, req: SchedRequest, snap: FleetSnapshot, cols: FleetColumns, scopes: tuple[_ColumnScope, ...]
    ) -> FleetSnapshot:
        """`scope` over columns: the same snapshot (the endpoints listed only when a scope cuts some)."""
        serving = cols.members.get(req.model)
        if serving is None:
            return snap  # nothing serves the model: nothing to cut
        reach = serving
        for scope in scopes:
            reach = scope(req, cols, reach, snap)
        if reach is serving or np.count_nonzero(reach) == np.count_nonzero(serving):
            return snap  # nothing cut (a scope only ever keeps a subset)
        cuts = self._cuts.of(snap)
        key = (req.model, reach.tobytes())
        got = cuts.get(key)
        if got is None:
            cut = serving & ~reach
            got = cuts[key] = dataclasses.replace(
                snap,
                endpoints=tuple(e for e, gone in zip(snap.endpoints, cut.tolist(), strict=True) if not gone),
            )
        return got

    def place(
        self, req: SchedRequest, snap: FleetSnapshot, among: Sequence[EndpointView] | None = None
    ) -> EndpointView | None:
        """The endpoint for `req` now, or None when nothing is eligible (the request stays queued).
        Over the snapshot's columns when the profile is columnar and they are its endpoints'. `among`:
        only these of the snapshot's endpoints are candidates (a request that fit nowhere, tried again on
        the endpoints that changed since: `gateway.sched.unfit`)."""
        if among is not None:
            return self._place_plain(req, snap, eligible(req, snap, among))
        cols = snap.columns
        columnar = self._columnar
        if (
            cols is not None
            and columnar is not None
            and cols.endpoints is snap.endpoints
            and req.pinned is None
        ):
            mask = cols.eligible(req.model)
            if np.count_nonzero(mask) >= self._columns_from:
                return self._place_columns(req, snap, cols, columnar, mask)
            views = snap.endpoints
            return self._place_plain(req, snap, [views[i] for i in mask.nonzero()[0].tolist()])
        return self._place_plain(req, snap, eligible(req, snap))

    def _place_plain(
        self, req: SchedRequest, snap: FleetSnapshot, eligible: list[EndpointView]
    ) -> EndpointView | None:
        """`place` with a Python step per endpoint, over the `eligible` endpoints."""
        if not eligible:
            return None
        return self._pick(req, self._filter(req, eligible, snap, 0), snap)

    def _pick(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> EndpointView | None:
        """The picker's plain form over the filters' survivors, scored (None: no survivor)."""
        if not candidates:
            return None
        chosen = self.picker.pick(req, self._scored(req, candidates, snap), snap)
        if not any(map(is_, repeat(chosen), candidates)):
            raise RuntimeError(f"picker {self.picker.name!r} returned an endpoint that was not a candidate")
        return chosen

    def _place_columns(
        self,
        req: SchedRequest,
        snap: FleetSnapshot,
        cols: FleetColumns,
        columnar: tuple[tuple[Filter, ...], tuple[tuple[ColumnarScorer, float], ...], ColumnarPicker],
        candidates: npt.NDArray[np.bool_],
    ) -> EndpointView | None:
        """`place` over columns, from the eligible `candidates`: the same choice (every plugin's columnar
        form gives what its plain one would), without a Python step per endpoint; from a filter that
        answered with the few it keeps as views (`ColumnarFewFilter`), the rest of the way in the plain
        forms over those."""
        _, scorers, picker = columnar
        mask = self._filter_columns(req, cols, candidates, snap, 0)
        if not isinstance(mask, np.ndarray):
            return self._pick(req, mask, snap)
        if not np.count_nonzero(mask):
            return None
        total: npt.NDArray[np.float64] | None = None
        for scorer, weight in scorers:
            values = scorer.score_columns(req, cols, snap)
            # min and max are NaN when any value is: the test fails then too (non-candidates' values are
            # clamped with the rest, harmlessly: they are not looked at)
            if not (values.min() >= 0.0 and values.max() <= 1.0):
                values = np.clip(np.nan_to_num(values, nan=0.0), 0.0, 1.0)
            if weight != 1.0:
                values = weight * values
            total = values if total is None else total + values
        scores = total if total is not None else np.zeros(len(cols.endpoints))
        i = int(picker.pick_columns(req, cols, mask, scores, snap))
        if not (0 <= i < len(mask) and mask[i]):
            raise RuntimeError(f"picker {self.picker.name!r} returned an endpoint that was not a candidate")
        return snap.endpoints[i]

    def _filter_columns(
        self,
        req: SchedRequest,
        cols: FleetColumns,
        mask: npt.NDArray[np.bool_],
        snap: FleetSnapshot,
        start: int,
    ) -> npt.NDArray[np.bool_] | Sequence[EndpointView]:
        """`_filter` over columns: the filters from `start` on; a tiered filter's tiers each go through
        the filters after it, in order, until one leaves candidates. A filter that answers with views
        (`ColumnarFewFilter`) hands them to the plain form of the filters after it (`_filter`): the
        survivors are then views, not a mask."""
        steps = self._column_steps
        for i in range(start, len(steps)):
            if not np.count_nonzero(mask):
                return mask
            tiers, one = steps[i]
            if tiers is None:
                assert one is not None  # (one or the other, by construction)
                aside = self._column_asides[i]
                if aside is None:
                    got = one(req, cols, mask, snap)
                else:
                    got = set_aside_columns(req, one, aside, cols, mask, snap)
                if not isinstance(got, np.ndarray):
                    return self._filter(req, got, snap, i + 1) if got else got
                mask = got
                continue
            for tier in tiers(req, cols, mask, snap):
                if not np.count_nonzero(tier):
                    continue
                survivors = self._filter_columns(req, cols, tier, snap, i + 1)
                if np.count_nonzero(survivors) if isinstance(survivors, np.ndarray) else survivors:
                    return survivors
            return np.zeros_like(mask)
        return mask

    def _scored(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> list[tuple[EndpointView, float]]:
        """Each candidate with its weighted score sum. Per scorer the values are taken in candidate
        order (a sequence as it is; from a mapping, an endpoint missing from it scores 0) and checked in
        C (`sum` is NaN when any value is; `min` and `max` show one out of range); only a scorer that
        broke its contract has its values clamped one by one. This runs for every candidate of every
        placement: over 100 endpoints a dict of totals and a Python-level check per value cost about
        10 µs of a placement's 54, and a scorer's mapping about 7 µs more than its sequence."""
        total: list[float] | None = None
        for ws in self.scorers:
            result = ws.scorer.score(req, candidates, snap)
            if isinstance(result, Mapping):
                get = result.get
                values = [get(e.id, 0.0) for e in candidates]
            else:
                values = result if type(result) is list else list(result)
                if len(values) != len(candidates):
                    name, n = ws.scorer.name, len(candidates)
                    raise RuntimeError(f"scorer {name!r} gave {len(values)} scores for {n} candidates")
            if math.isnan(sum(values)) or min(values) < 0.0 or max(values) > 1.0:
                values = [_clamp01(v) for v in values]
            weight = ws.weight
            if weight != 1.0:
                values = [weight * v for v in values]
            total = values if total is None else [a + b for a, b in zip(total, values, strict=True)]
        return list(zip(candidates, total if total is not None else [0.0] * len(candidates), strict=True))

    def _filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot, start: int
    ) -> Sequence[EndpointView]:
        """The filters from `start` on; a tiered filter's tiers each go through the filters after it,
        in order, until one leaves candidates."""
        filters = self.filters
        for i in range(start, len(filters)):
            if not candidates:
                return candidates
            tiers = self._tiers[i]
            if tiers is None:
                aside = self._asides[i]
                if aside is None:
                    candidates = filters[i].filter(req, candidates, snap)
                else:
                    candidates = set_aside(req, filters[i], aside, candidates, snap)
                continue
            for tier in tiers(req, candidates, snap):
                survivors = self._filter(req, tier, snap, i + 1) if tier else tier
                if survivors:
                    return survivors
            return []
        return candidates


def _clamp01(v: float) -> float:
    if math.isnan(v):
        return 0.0
    return 0.0 if v < 0.0 else 1.0 if v > 1.0 else v


@dataclass(frozen=True, slots=True)
class Policy:
    """A built policy file: what the scheduler swaps atomically on reload."""

    name: str
    ordering: Ordering
    profile: SchedulerProfile
    source: str = ""  # file it came from
    slo: SloPolicy = field(default_factory=default_slo_policy)  # SLO classes, rules, task settings
    admitter: Admitter | None = None  # None: admit every request (no admission control)
    # Requests behind one that fits nowhere (while endpoints have room) that may be placed before it in
    # one round of serving the queue; 0: strict priority (see gateway.sched.scheduler).
    lookahead: int = 0
    # Which running request gives its seat to one that cannot be placed; None: never preempt.
    preemptor: Preemptor | None = None
    # Sets each endpoint's concurrency cap; None: the configured caps (static).
    concurrency: ConcurrencyController | None = None
    # The global autoscaler and its runner's settings; None: no autoscaling (the lifecycle's cold starts
    # and evictions only).
    autoscale: Autoscale | None = None
    # The endpoint loads its plugins share (`LoadCaches`, by prediction parameters); the scheduler's own
    # predictions (preemption's victims) take theirs from it too.
    loads: LoadCaches = field(default_factory=LoadCaches, compare=False, repr=False)
    # The ordering's `engine_priority` method when it has one (`EnginePriority`): resolved once here.
    _engine_priority: Callable[[SchedRequest, FleetSnapshot], int | None] | None = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        o = self.ordering
        object.__setattr__(
            self, "_engine_priority", o.engine_priority if isinstance(o, EnginePriority) else None
        )

    def engine_priority(self, req: SchedRequest, snap: FleetSnapshot) -> int | None:
        """The priority to send an engine with priority scheduling (lower is more urgent), when the
        ordering has one (`EnginePriority`)."""
        get = self._engine_priority
        return None if get is None else get(req, snap)
