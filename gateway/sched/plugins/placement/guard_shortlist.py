"""The overflow guard's shortlist rank (`OverflowGuardParams.shortlist`): its busy candidates, least loaded
first by an estimate of best fit's capacity norm (the L2 norm of running / seats and Σ(context +
γ·remaining) over the running requests / KV capacity, or seats × tokens per seat where that is unknown),
without making their loads.

Per endpoint of a fleet's columns (by place) it keeps the two things the guard's last judged load there
gave: its running requests and its token share. An endpoint's estimate is the running share as the
columns give it now and that token share scaled by its running requests now over then; an endpoint
never judged comes first (judging it writes its numbers). A load's tokens grow as its requests progress
(context grows by one a token, what remains falls by one, γ < 1), so an endpoint running the same
requests is estimated at most at its norm now: it is judged again before a busier one, and its estimate
brought up. One that has lost requests since is estimated at about its norm now.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import numpy as np
import numpy.typing as npt

from gateway.core.types import EndpointId
from gateway.sched.plugins.placement.best_fit import TOKENS_PER_SEAT
from gateway.sched.predict import EndpointLoad
from gateway.sched.snapshot import FleetColumns

#: Best fit's default γ (the share of a running request's remaining output counted,
#: `gateway.sched.plugins.placement.best_fit`); its tokens per seat where the KV capacity is unknown is
#: `TOKENS_PER_SEAT` there.
GAMMA: Final = 0.5


class ShortlistRank:
    """What the shortlist ranks busy candidates by, per endpoint of one fleet's columns (see the
    module)."""

    __slots__ = ("_index", "_known", "_n", "_share")

    def __init__(self) -> None:
        self._index: Mapping[EndpointId, int] | None = None  # the columns' places the numbers are kept by
        self._n: npt.NDArray[np.float64] = np.zeros(0)  # running requests of the load last judged
        self._share: npt.NDArray[np.float64] = np.zeros(0)  # its token share
        self._known: npt.NDArray[np.bool_] = np.zeros(0, dtype=np.bool_)

    def _of(self, cols: FleetColumns) -> None:
        if self._index is not cols.index or len(self._n) != len(cols.endpoints):
            n = len(cols.endpoints)
            self._index = cols.index
            self._n = np.zeros(n)
            self._share = np.zeros(n)
            self._known = np.zeros(n, dtype=np.bool_)

    def order(self, cols: FleetColumns, places: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
        """The busy candidates at `places` (of `cols`) least loaded first by their estimates (`keys`),
        then by id."""
        return places[np.lexsort((cols.id_rank[places], self.keys(cols, places)))]

    def keys(self, cols: FleetColumns, places: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        """The estimate of best fit's capacity norm of each endpoint at `places` (-inf: never judged)."""
        self._of(cols)
        n_now = cols.busy[places].astype(np.float64)
        n_then = self._n[places]
        then = n_then > 0.0
        share = np.zeros(len(places))
        share[then] = self._share[places][then] * n_now[then] / n_then[then]
        keys: npt.NDArray[np.float64] = np.hypot(n_now / cols.seats[places], share)
        keys[~self._known[places]] = -math.inf
        return keys

    def saw(self, cols: FleetColumns, places: npt.NDArray[np.intp], loads: list[EndpointLoad]) -> None:
        """Keep what each of `loads` (the guard's, of the endpoint at the same place of `places`) gives:
        its running requests and token share (`token_share`, kept on the load: it is judged by many
        placements while it is reused)."""
        self._of(cols)
        share: list[float | None] = [load.memo.get(_SHARE_KEY) for load in loads]
        for j, got in enumerate(share):
            if got is None:
                load = loads[j]
                share[j] = load.memo[_SHARE_KEY] = token_share(load)
        self._n[places] = [load.n for load in loads]
        self._share[places] = share
        self._known[places] = True


#: The memo key of a load's token share (`token_share`).
_SHARE_KEY: Final = "shortlist-share"


def token_share(load: EndpointLoad, gamma: float = GAMMA) -> float:
    """The token share of best fit's capacity norm of `load`: Σ(context + γ·remaining) over the running
    requests / KV capacity (or seats × tokens per seat), from the load's sums: its context sum and its
    remaining tokens added one after another (the sums a load's row in `FleetLoads` holds)."""
    remaining = 0.0
    for st in load.states:
        remaining += st[2]
    return (load.ctx_sum + gamma * remaining) / (load.kv_capacity or load.seats * TOKENS_PER_SEAT)
