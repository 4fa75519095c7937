"""Least outstanding: prefer the endpoint with the fewest requests in flight or waiting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.sched.registry import NoParams, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetColumns, FleetSnapshot


class LeastOutstandingScorer:
    """Score 1 / (1 + outstanding), where outstanding = gateway in-flight + engine waiting."""

    name = "least-outstanding"

    def score(
        self, req: SchedRequest, candidates: Sequence[EndpointView], snap: FleetSnapshot
    ) -> list[float]:
        # `EndpointView.outstanding` spelled out (a property call per candidate is a third of this).
        return [1.0 / (1.0 + (e.inflight + (e.engine_waiting or 0.0))) for e in candidates]

    def score_columns(
        self, req: SchedRequest, cols: FleetColumns, snap: FleetSnapshot
    ) -> npt.NDArray[np.float64]:
        """`score` over columns: the same arithmetic in the same order."""
        return 1.0 / (1.0 + cols.outstanding)


class MaxScorePicker:
    """Highest weighted score; ties go to the lowest in-flight count, then the endpoint id."""

    name = "max-score"

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView:
        return min(scored, key=lambda es: (-es[1], es[0].inflight, es[0].id))[0]

    def pick_columns(
        self,
        req: SchedRequest,
        cols: FleetColumns,
        candidates: npt.NDArray[np.bool_],
        scores: npt.NDArray[np.float64],
        snap: FleetSnapshot,
    ) -> int:
        """`pick` over columns: the highest score, then the fewest in flight, then the first id (whole-array
        steps: a fleet's endpoints often tie on the first two). A single candidate (a filter kept one,
        as best fit does) is taken without them."""
        if np.count_nonzero(candidates) == 1:
            return int(candidates.nonzero()[0][0])
        s = np.where(candidates, scores, -np.inf)
        best = s == s.max()
        inflight = np.where(best, cols.inflight, _NONE)
        fewest = best & (inflight == inflight.min())
        return int(np.where(fewest, cols.id_rank, _NONE).argmin())


_NONE: Final = np.iinfo(np.int64).max  # past every in-flight count and id rank


SCORER_SPEC = PluginSpec(
    PluginKind.SCORER,
    "least-outstanding",
    NoParams,
    lambda p, ctx: LeastOutstandingScorer(),
    "1/(1 + gateway in-flight + engine waiting)",
)
PICKER_SPEC = PluginSpec(
    PluginKind.PICKER, "max-score", NoParams, lambda p, ctx: MaxScorePicker(), "highest weighted score"
)
