"""Where the live daemon computes the configuration choice (`gateway.lifecycle.config_choice`): off its
event loop (the daemon allows no stall beyond ~1 ms).

The whole choice, MaaSO's placement for the model's whole room (`Placer.place`: ~20 ms for 24 devices of
five configurations, ~0.1 s for 48) and the configuration of each next instance (`Placer.next_config`
once per instance, ~0.5 ms each), is one pure function of immutable inputs
(`gateway.lifecycle.choice_plan.plan_choice`). `ThreadPlans` runs it in a worker thread
(`asyncio.to_thread`, in a task spawned through the `TaskSupervisor`), at most one per model at a time,
and keeps the latest completed plan per model. The thread only computes and returns; the plan is stored
on the event loop, so the chooser's state keeps one writer. A plan asked for while one is computed for
the model is not queued: the chooser asks again after the next round, with its own inputs.

The fleet simulator computes the choice where it is asked for (`ConfigChooser` without `ahead`).
"""

from __future__ import annotations

import asyncio

import structlog

from gateway.core.tasks import TaskSupervisor
from gateway.core.types import ModelName
from gateway.lifecycle.choice_plan import ChoiceInputs, ChoicePlan, plan_choice

log = structlog.get_logger("berth.autoscale")


class ThreadPlans:
    """Choice plans computed in a worker thread; the latest completed per model (`PlanAhead`)."""

    def __init__(self, supervisor: TaskSupervisor) -> None:
        self._supervisor = supervisor
        self._latest: dict[ModelName, ChoicePlan] = {}
        self._running: dict[ModelName, asyncio.Task[None]] = {}

    def compute(self, model: ModelName, inputs: ChoiceInputs) -> bool:
        if model in self._running:
            return False
        self._running[model] = self._supervisor.spawn(
            f"config-choice-{model}", lambda: self._plan(model, inputs), restart=False
        )
        return True

    def latest(self, model: ModelName) -> ChoicePlan | None:
        return self._latest.get(model)

    async def _plan(self, model: ModelName, inputs: ChoiceInputs) -> None:
        try:
            plan = await asyncio.to_thread(plan_choice, inputs)
        finally:
            self._running.pop(model, None)
        self._latest[model] = plan  # on the event loop: the one writer
        log.debug("config_choice_planned", model=model, free_devices=inputs.free, instances=len(plan.steps))

    async def settled(self) -> None:
        """Wait for the plans being computed now (tests, shutdown)."""
        for task in list(self._running.values()):
            await asyncio.wait({task})
