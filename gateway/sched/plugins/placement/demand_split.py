"""Endpoint groups for sets of SLO classes, sized by measured demand (Chiron's instance classes, with the
split made from traffic instead of by hand) as a filter.

Requests that want different things from an engine hurt each other when they share a batch: a long
prompt's prefill pauses every decode, and long contexts slow every decode iteration, so short-context
requests with per-token deadlines (code generation) miss them beside long-context ones (translation,
summarization). This filter gives each group of classes its own endpoints of the model:

- `groups` names the groups and their classes; a class in no group may use any endpoint.
- Each group's demand is the engine time its requests add (prefill, plus each output token's share of
  a decode iteration at `batch_ref` requests: ``k1·p + c1 + o·(k2·(p + o/2) + c2 + c3/batch_ref)``),
  summed with an exponential decay of time constant `window_s`. Every request counts once, when the
  filter first sees it (at admission or placement).
- A model's ready endpoints, in id order, are cut into one block per group in proportion to the
  groups' demand (largest remainders, at least `min_endpoints` each; equal blocks before any demand).
  The blocks move only when a group's ideal share is more than ``0.5 + hysteresis`` endpoints away from
  its block, so a boundary does not flap between two endpoints.
- A request keeps to its group's endpoints, and `spill` says when it may use the others: "never" (it
  waits for its own), "when-full" (none of its own has a free seat) or "when-no-fit" (none of its own
  passes the filters after this one, e.g. best-fit's constraints: the own group and then the others
  are the filter's preference tiers). One mode for every group, or a table by group name (groups it
  does not name: "when-full").
- Admission judges a request of a group that never spills on its group's block only (the filter's
  `scope`), and a request counts in its group's demand from that first look, so requests turned away
  still size their group.

With fewer ready endpoints than groups (``min_endpoints`` each) there is no split: every request may use
every endpoint. The filter keeps its state per model; it never empties a candidate list that had an
endpoint of the request's group with room.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec import Meta

from gateway.core.types import EndpointId, ModelName
from gateway.sched.perf import PerfCoefficients, default_prior
from gateway.sched.prefix import uncached
from gateway.sched.registry import BuildContext, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.running import output_estimate
from gateway.sched.seen import SeenRequests
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot

_PRIOR: Final = default_prior()

SpillMode = Literal["never", "when-full", "when-no-fit"]


class DemandSplitParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    groups: dict[str, list[str]]  # group name -> SLO classes
    window_s: Annotated[float, Meta(gt=0.0)] = 30.0  # time constant of the demand's decay
    batch_ref: Annotated[int, Meta(ge=1)] = 8  # batch size that shares a decode iteration's fixed cost
    min_endpoints: Annotated[int, Meta(ge=1)] = 1  # per group, when the model has enough endpoints
    hysteresis: Annotated[float, Meta(ge=0.0, le=2.0)] = 0.25
    spill: SpillMode | dict[str, SpillMode] = "when-full"


@dataclass(slots=True)
class _ModelState:
    demand: list[float]  # decayed engine seconds per group
    at: float | None = None  # clock time of the last decay
    blocks: dict[EndpointId, int] = field(default_factory=dict)  # endpoint -> group index
    counts: tuple[int, ...] = ()  # endpoints per group, in group order
    endpoints: tuple[EndpointId, ...] = ()  # the ready endpoints the blocks were cut from
    # The ready endpoints `blocks` was last asked for with the demand as it is (None: the demand moved
    # since): asked again for them, the blocks are the same (a request's scope, then its placement).
    asked: tuple[EndpointId, ...] | None = None


def request_work(req: SchedRequest, coef: PerfCoefficients, batch_ref: int) -> float:
    """Engine seconds `req` adds: its prefill (of the tokens not cached where most of its prefix is
    held), and each output token's share of a decode iteration shared by `batch_ref` requests."""
    p = float(req.prompt_tokens)
    out, _ = output_estimate(req)
    per_token = coef.k2 * (p + 0.5 * out) + coef.c2 + coef.c3 / batch_ref
    return coef.prefill_s(uncached(req.prompt_tokens, req.cached.best)) + out * per_token


def block_sizes(shares: Sequence[float], n: int, least: int) -> tuple[int, ...]:
    """`n` endpoints in proportion to `shares`, at least `least` each (largest remainders)."""
    g = len(shares)
    spare = n - least * g
    total = sum(shares)
    ideal = [spare * s / total if total > 0 else spare / g for s in shares]
    counts = [least + math.floor(x) for x in ideal]
    left = n - sum(counts)
    by_remainder = sorted(range(g), key=lambda i: (-(ideal[i] - math.floor(ideal[i])), i))
    for i in by_remainder[:left]:
        counts[i] += 1
    return tuple(counts)


class DemandSplitFilter:
    name = "demand-split"

    def __init__(self, params: DemandSplitParams) -> None:
        self.params = params
        self.group_names = tuple(params.groups)
        self.group_of: dict[str, int] = {}
        for i, classes in enumerate(params.groups.values()):
            for cls in classes:
                self.group_of[cls] = i
        spill = params.spill
        by_group = spill if isinstance(spill, Mapping) else {}
        default: SpillMode = "when-full" if isinstance(spill, Mapping) else spill
        self.spill: tuple[SpillMode, ...] = tuple(by_group.get(g, default) for g in self.group_names)
        self._models: dict[ModelName, _ModelState] = {}
        self._seen = SeenRequests()  # the requests counted, each once
        # Per model: the snapshot views the ready endpoints were last found in, and those endpoints.
        self._ready_kept: dict[ModelName, tuple[tuple[EndpointView, ...], tuple[EndpointId, ...]]] = {}
        # Per model: the ready endpoints' ids in the views' order the plain `_ready` last sorted, and
        # their sorted tuple.
        self._ready_named: dict[ModelName, tuple[tuple[EndpointId, ...], tuple[EndpointId, ...]]] = {}
        # Per model: the columns' index and ready mask `_ready_of_columns` listed the ready endpoints for,
        # and that list.
        self._ready_cols: dict[ModelName, tuple[object, npt.NDArray[np.bool_], tuple[EndpointId, ...]]] = {}
        # Per (model, group): the blocks and the columns' index a mask of the group's own endpoints was
        # made for, and that mask (`tiers_columns`).
        self._own_masks: dict[tuple[ModelName, int], tuple[object, object, npt.NDArray[np.bool_]]] = {}
        # Per model: the last mask of the endpoints serving it `scope_columns` was asked with, and the
        # place of its first endpoint (-1: none).
        self._first: dict[ModelName, tuple[npt.NDArray[np.bool_], int]] = {}

    def filter(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        return next((t for t in self.tiers(req, candidates, snap) if t), [])

    def tiers(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[Sequence[EndpointView]]:
        group = self.group_of.get(req.slo.slo_class)
        if group is None or not candidates:
            return [candidates]
        blocks = self._count(req, group, snap, candidates[0].perf)
        if not blocks:
            return [candidates]
        own: list[EndpointView] = []
        others: list[EndpointView] = []
        for e in candidates:
            (own if blocks.get(e.id, group) == group else others).append(e)
        spill = self.spill[group]
        if spill == "never":
            return [own]
        if spill == "when-full":
            return [own or others]
        return [own, others]

    def tiers_columns(
        self, req: SchedRequest, cols: FleetColumns, candidates: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> Sequence[npt.NDArray[np.bool_]]:
        """`tiers` as masks: the request's group's block from a mask kept while the blocks are the same."""
        group = self.group_of.get(req.slo.slo_class)
        if group is None or not np.count_nonzero(candidates):
            return [candidates]
        first = cols.endpoints[int(candidates.nonzero()[0][0])]
        blocks = self._count(req, group, snap, first.perf)
        if not blocks:
            return [candidates]
        own_mask = self._own_mask(req.model, group, blocks, cols)
        own = candidates & own_mask
        others = candidates & ~own_mask
        spill = self.spill[group]
        if spill == "never":
            return [own]
        if spill == "when-full":
            return [own if np.count_nonzero(own) else others]
        return [own, others]

    def scope(
        self, req: SchedRequest, serving: Sequence[EndpointView], snap: FleetSnapshot
    ) -> Sequence[EndpointView]:
        """The endpoints `req` may be placed on whatever their load: its group's block when the group
        never spills, else all of them. Admission asks this before the request is queued, so a request
        it turns away still counts in its group's demand."""
        group = self.group_of.get(req.slo.slo_class)
        if group is None or not serving:
            return serving
        blocks = self._count(req, group, snap, serving[0].perf)
        if not blocks or self.spill[group] != "never":
            return serving
        return [e for e in serving if blocks.get(e.id, group) == group]

    def scope_columns(
        self, req: SchedRequest, cols: FleetColumns, serving: npt.NDArray[np.bool_], snap: FleetSnapshot
    ) -> npt.NDArray[np.bool_]:
        """`scope` as a mask (the group's block from the mask `tiers_columns` keeps)."""
        group = self.group_of.get(req.slo.slo_class)
        if group is None:
            return serving
        # the first endpoint serving the model, kept for the mask (the columns keep one per model while
        # which endpoints serve it is the same)
        kept = self._first.get(req.model)
        if kept is None or kept[0] is not serving:
            nonzero = serving.nonzero()[0]
            kept = self._first[req.model] = (serving, int(nonzero[0]) if len(nonzero) else -1)
        if kept[1] < 0:
            return serving
        blocks = self._count(req, group, snap, cols.endpoints[kept[1]].perf)
        if not blocks or self.spill[group] != "never":
            return serving
        return serving & self._own_mask(req.model, group, blocks, cols)

    def _own_mask(
        self, model: ModelName, group: int, blocks: dict[EndpointId, int], cols: FleetColumns
    ) -> npt.NDArray[np.bool_]:
        """The endpoints of `group`'s block, and those in no block, as a mask; kept while the blocks and
        the columns' endpoints are the same."""
        key = (model, group)
        kept = self._own_masks.get(key)
        if kept is None or kept[0] is not blocks or kept[1] is not cols.index:
            own_mask = np.ones(len(cols.endpoints), dtype=np.bool_)
            index = cols.index
            for eid, g in blocks.items():
                i = index.get(eid)
                if i is not None and g != group:
                    own_mask[i] = False
            kept = self._own_masks[key] = (blocks, cols.index, own_mask)
        return kept[2]

    def _count(
        self, req: SchedRequest, group: int, snap: FleetSnapshot, perf: PerfCoefficients | None
    ) -> dict[EndpointId, int]:
        """Add `req`'s work to its group's demand (once per request) and return the model's blocks."""
        state = self._models.get(req.model)
        if state is None:
            state = self._models[req.model] = _ModelState(demand=[0.0] * len(self.group_names))
        if self._decay(state, snap.now):
            state.asked = None
        if self._seen.first(req.id):
            state.demand[group] += request_work(req, perf or _PRIOR, self.params.batch_ref)
            state.asked = None
        ready = self._ready(req.model, snap)
        if state.asked is ready:
            return state.blocks  # (the same shares and endpoints as the last call: its answer)
        blocks = self._blocks(state, ready)
        state.asked = ready
        return blocks

    def shares(self, model: ModelName) -> tuple[float, ...]:
        """Each group's share of the model's recent demand (equal before any)."""
        state = self._models.get(model)
        return self._shares(state.demand if state is not None else [])

    def groups(self, model: ModelName) -> dict[str, tuple[float | None, list[EndpointId]]]:
        """Every group's share of the model's recent demand and its endpoints now, in group order."""
        shares = self.shares(model)
        blocks = self.blocks(model)
        return {
            name: (share, sorted((e for e, g in blocks.items() if g == name), key=str))
            for name, share in zip(self.group_names, shares, strict=True)
        }

    def blocks(self, model: ModelName) -> dict[EndpointId, str]:
        """The current assignment of the model's endpoints to groups (for the admin view and tests)."""
        state = self._models.get(model)
        if state is None:
            return {}
        return {e: self.group_names[i] for e, i in state.blocks.items()}

    def _decay(self, state: _ModelState, now: float) -> bool:
        """The demand decayed to `now`; whether the clock moved since the last decay."""
        if state.at is None or now > state.at:
            if state.at is not None:
                f = math.exp(-(now - state.at) / self.params.window_s)
                state.demand = [d * f for d in state.demand]
            state.at = now
            return True
        return False

    def _ready(self, model: ModelName, snap: FleetSnapshot) -> tuple[EndpointId, ...]:
        """The ready endpoints serving `model`, in id order; kept for the snapshot's views (admission's
        recheck asks for every queued request of a tick, placement for every request of a serve). From
        the list the views share (`FleetSnapshot.ready`) when the snapshot has their memo (the
        scheduler's do: carried over from the last views, with the same ids while which endpoints are
        ready did not change), else from the columns when it carries them."""
        kept = self._ready_kept.get(model)
        if kept is not None and kept[0] is snap.endpoints:
            return kept[1]
        cols = snap.columns
        memo = snap.memo
        if (
            cols is not None
            and cols.endpoints is snap.endpoints
            and (memo is None or memo.endpoints is not cols.endpoints)
        ):
            ready = self._ready_of_columns(model, cols)
            self._ready_kept[model] = (snap.endpoints, ready)
            return ready
        # the ready endpoints listed once for the views (`FleetSnapshot.ready`), sorted again only when
        # which endpoints they are changed (not their load)
        ids = snap.ready(model).ids()
        named = self._ready_named.get(model)
        if named is not None and (named[0] is ids or named[0] == ids):
            ready = named[1]
        else:
            ready = tuple(sorted(ids, key=str))
            self._ready_named[model] = (ids, ready)
        self._ready_kept[model] = (snap.endpoints, ready)
        return ready

    def _ready_of_columns(self, model: ModelName, cols: FleetColumns) -> tuple[EndpointId, ...]:
        """`_ready` from the columns: the same endpoints (ready, serving `model`) in the same order (the
        columns' id rank), listed again only when which endpoints are ready changed."""
        serves = cols.members.get(model)
        mask = np.zeros(len(cols.endpoints), dtype=np.bool_) if serves is None else serves & cols.ready
        kept = self._ready_cols.get(model)
        if kept is not None and kept[0] is cols.index and np.array_equal(kept[1], mask):
            return kept[2]
        order = np.argsort(cols.id_rank)
        views = cols.endpoints
        ready = tuple(views[i].id for i in order[mask[order]].tolist())
        self._ready_cols[model] = (cols.index, mask, ready)
        return ready

    def _blocks(self, state: _ModelState, ready: tuple[EndpointId, ...]) -> dict[EndpointId, int]:
        g = len(self.group_names)
        n = len(ready)
        least = self.params.min_endpoints
        if n < g * least:
            state.blocks, state.counts, state.endpoints = {}, (), ready
            return state.blocks
        shares = self._shares(state.demand)
        if (
            (ready is state.endpoints or ready == state.endpoints)
            and state.counts
            and self._within(state.counts, shares, n)
        ):
            return state.blocks
        counts = block_sizes(shares, n, least)
        blocks: dict[EndpointId, int] = {}
        at = 0
        for i, c in enumerate(counts):
            for eid in ready[at : at + c]:
                blocks[eid] = i
            at += c
        state.blocks, state.counts, state.endpoints = blocks, counts, ready
        return blocks

    def _shares(self, demand: Sequence[float]) -> tuple[float, ...]:
        total = sum(demand)
        if total <= 0:
            return tuple(1.0 / len(self.group_names) for _ in self.group_names)
        return tuple([d / total for d in demand])

    def _within(self, counts: Sequence[int], shares: Sequence[float], n: int) -> bool:
        """The current blocks still fit the shares (every group within 0.5 + hysteresis endpoints)."""
        limit = 0.5 + self.params.hysteresis
        return all(abs(n * s - c) <= limit for c, s in zip(counts, shares, strict=True))


def _build(p: DemandSplitParams, ctx: BuildContext) -> DemandSplitFilter:
    if isinstance(p.spill, dict):
        for name in p.spill:
            if name not in p.groups:
                raise ValueError(f"spill names {name!r}, which is not a group")
    if len(p.groups) < 2:
        raise ValueError("demand-split needs at least two groups")
    seen: dict[str, str] = {}
    known = set(ctx.slo.classes)
    for name, classes in p.groups.items():
        if not classes:
            raise ValueError(f"group {name!r} names no SLO class")
        for cls in classes:
            if cls in seen:
                raise ValueError(f"SLO class {cls!r} is in groups {seen[cls]!r} and {name!r}")
            if known and cls not in known:
                raise ValueError(
                    f"group {name!r}: unknown SLO class {cls!r} (known: {', '.join(sorted(known))})"
                )
            seen[cls] = name
    return DemandSplitFilter(p)


SPEC = PluginSpec(
    PluginKind.FILTER,
    "demand-split",
    DemandSplitParams,
    _build,
    "Chiron-style endpoint groups per set of SLO classes, sized by measured demand",
)
