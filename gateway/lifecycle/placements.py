"""Where the configuration choice's placement search runs (`gateway.lifecycle.config_choice`).

MaaSO's placement for a model's whole room (`Placer.place`) is a search over every device count and
configuration: ~20 ms for 24 devices of five configurations, ~0.1 s for 48 (more kinds in the mix, more
configurations: more). The fleet simulator runs on a virtual clock and may compute it where it is asked
for; the live daemon must not stall its event loop for it (issue 18: no stall beyond ~1 ms).

- `InlinePlacements` (the simulator, tests): computes it at once.
- `ThreadPlacements` (the live daemon): hands the search's inputs, which are immutable (the placer with
  its profiles, the mix, the device budget), to a worker thread (`asyncio.to_thread`, in a task spawned
  through the `TaskSupervisor`), one search per model at a time, and answers with the latest completed
  placement of that model (None before the first completes: the choice then takes the best next step
  alone). The thread only computes and returns; the result is stored on the event loop, so the chooser's
  state keeps one writer. A search asked for while one runs for the model is not queued: the next round
  asks again with its own inputs.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import structlog

from gateway.core.tasks import TaskSupervisor
from gateway.core.types import ModelName
from gateway.sched.heterogeneous import Placement, TrafficMix

log = structlog.get_logger("berth.autoscale")


class PlacementSearch(Protocol):
    """What computes a placement (`gateway.sched.heterogeneous.Placer`); pure, immutable."""

    def place(self, mix: TrafficMix, devices: int) -> Placement: ...


class Placements(Protocol):
    """The placement of `devices` devices for `model`'s `mix`, or None when none is available yet."""

    def placement(
        self, model: ModelName, placer: PlacementSearch, mix: TrafficMix, devices: int
    ) -> Placement | None: ...


class InlinePlacements:
    """The search where it is asked for (a virtual clock: the fleet simulator, tests)."""

    def placement(
        self, model: ModelName, placer: PlacementSearch, mix: TrafficMix, devices: int
    ) -> Placement | None:
        return placer.place(mix, devices)


class ThreadPlacements:
    """The search in a worker thread; the latest completed placement per model (module docstring)."""

    def __init__(self, supervisor: TaskSupervisor) -> None:
        self._supervisor = supervisor
        self._latest: dict[ModelName, Placement] = {}
        self._running: dict[ModelName, asyncio.Task[None]] = {}

    def placement(
        self, model: ModelName, placer: PlacementSearch, mix: TrafficMix, devices: int
    ) -> Placement | None:
        if model not in self._running:
            self._running[model] = self._supervisor.spawn(
                f"config-placement-{model}",
                lambda: self._search(model, placer, mix, devices),
                restart=False,
            )
        return self._latest.get(model)

    async def _search(self, model: ModelName, placer: PlacementSearch, mix: TrafficMix, devices: int) -> None:
        try:
            placement = await asyncio.to_thread(placer.place, mix, devices)
        finally:
            self._running.pop(model, None)
        self._latest[model] = placement  # on the event loop: the one writer
        log.debug(
            "config_placement_ready", model=model, devices=devices, instances=len(placement.all_instances)
        )

    async def settled(self) -> None:
        """Wait for the searches running now (tests, shutdown)."""
        for task in list(self._running.values()):
            await asyncio.wait({task})
