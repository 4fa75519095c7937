"""Power of two choices: sample two candidates at random, keep the better scored."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Annotated

import msgspec

from gateway.sched.registry import BuildContext, PluginKind, PluginSpec
from gateway.sched.request import SchedRequest
from gateway.sched.snapshot import EndpointView, FleetSnapshot


class PowerOfTwoParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    choices: Annotated[int, msgspec.Meta(ge=1)] = 2  # checked here so the error names `params.choices`
    seed: int | None = None


class PowerOfTwoPicker:
    """Samples `choices` distinct candidates and returns the best scored (ties: fewer in flight)."""

    name = "power-of-two"

    def __init__(self, params: PowerOfTwoParams, rng: random.Random) -> None:
        if params.choices < 1:
            raise ValueError("choices must be at least 1")
        self.params = params
        self._rng = rng

    def pick(
        self, req: SchedRequest, scored: Sequence[tuple[EndpointView, float]], snap: FleetSnapshot
    ) -> EndpointView:
        sample = self._rng.sample(list(scored), min(self.params.choices, len(scored)))
        return min(sample, key=lambda es: (-es[1], es[0].inflight, es[0].id))[0]


def _build(p: PowerOfTwoParams, ctx: BuildContext) -> PowerOfTwoPicker:
    seed = p.seed if p.seed is not None else ctx.seed
    return PowerOfTwoPicker(p, random.Random(seed))


SPEC = PluginSpec(
    PluginKind.PICKER, "power-of-two", PowerOfTwoParams, _build, "best scored of two random candidates"
)
