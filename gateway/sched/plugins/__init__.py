"""In-tree plugins, registered explicitly by `gateway.sched.registry.default_registry()`."""

from __future__ import annotations

from typing import Any

from gateway.sched.plugins.ordering import fcfs
from gateway.sched.plugins.placement import least_outstanding, power_of_two, round_robin
from gateway.sched.registry import PluginSpec

IN_TREE: tuple[PluginSpec[Any], ...] = (
    fcfs.SPEC,
    round_robin.SPEC,
    least_outstanding.SCORER_SPEC,
    least_outstanding.PICKER_SPEC,
    power_of_two.SPEC,
)
