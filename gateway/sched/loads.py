"""Endpoint loads kept between the queries of one decision: `LoadCache` reuses an endpoint's
`EndpointLoad` while its view object is the same and the clock moved less than 10 ms (one placement; a
served queue), and `LoadCaches` shares one cache among the plugins of a policy that predict with the same
parameters."""

from __future__ import annotations

from typing import Final

from gateway.sched.predict import EndpointLoad, PredictParams
from gateway.sched.snapshot import EndpointView

#: Views whose load was computed within this many seconds are reused.
_CACHE_TOLERANCE_S: Final = 0.01


class LoadCache:
    """`EndpointLoad`s by endpoint, reused while the view object is the same and the clock moved less
    than 10 ms (one placement decision; a served queue)."""

    __slots__ = ("_loads", "params")

    def __init__(self, params: PredictParams) -> None:
        self.params = params
        self._loads: dict[str, EndpointLoad] = {}

    def load(self, view: EndpointView, now: float) -> EndpointLoad:
        got = self._loads.get(view.id)
        if got is not None and got.view is view and abs(got.now - now) <= _CACHE_TOLERANCE_S:
            return got
        fresh = self._loads[view.id] = EndpointLoad(view, now, self.params)
        if len(self._loads) > 4096:  # endpoints come and go: never grow without bound
            self._loads = {view.id: fresh}
        return fresh


class LoadCaches:
    """One `LoadCache` per set of prediction parameters, shared by the plugins of one policy: the
    filters of one placement (and admission and ordering, when their parameters agree) then derive each
    endpoint's load once between them."""

    __slots__ = ("_caches",)

    def __init__(self) -> None:
        self._caches: dict[PredictParams, LoadCache] = {}

    def get(self, params: PredictParams) -> LoadCache:
        cache = self._caches.get(params)
        if cache is None:
            cache = self._caches[params] = LoadCache(params)
        return cache
