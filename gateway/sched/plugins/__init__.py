"""The in-tree plugins, listed once, and the registry that holds them (`default_registry()`)."""

from __future__ import annotations

from typing import Any

from gateway.sched.plugins.admission import admit_all, slo_feasibility
from gateway.sched.plugins.autoscale import (
    aladdin_workers,
    cato_sla,
    queue_length,
    utilization_band,
)
from gateway.sched.plugins.autoscale import chiron as chiron_scaler
from gateway.sched.plugins.concurrency import chiron, chiron_paper, static
from gateway.sched.plugins.eviction import cace, lru
from gateway.sched.plugins.ordering import bands, edf, fcfs, slack
from gateway.sched.plugins.placement import (
    best_fit,
    cato_slack,
    demand_split,
    instance_class,
    least_outstanding,
    overflow_guard,
    power_of_two,
    prefix_affinity,
    prefix_holders,
    round_robin,
    sub_cluster,
)
from gateway.sched.plugins.preempt import least_progress, most_slack, smallest_kv_loss
from gateway.sched.registry import PluginRegistry, PluginSpec

IN_TREE: tuple[PluginSpec[Any], ...] = (
    fcfs.SPEC,
    edf.SPEC,
    slack.SPEC,
    bands.SPEC,
    round_robin.SPEC,
    least_outstanding.SCORER_SPEC,
    least_outstanding.PICKER_SPEC,
    power_of_two.SPEC,
    cato_slack.SPEC,
    best_fit.SPEC,
    overflow_guard.SPEC,
    demand_split.SPEC,
    instance_class.SPEC,
    sub_cluster.SPEC,
    prefix_affinity.SPEC,
    prefix_holders.SPEC,
    admit_all.SPEC,
    slo_feasibility.SPEC,
    lru.SPEC,
    cace.SPEC,
    least_progress.SPEC,
    most_slack.SPEC,
    smallest_kv_loss.SPEC,
    static.SPEC,
    chiron.SPEC,
    chiron_paper.SPEC,
    chiron_scaler.SPEC,
    cato_sla.SPEC,
    aladdin_workers.SPEC,
    utilization_band.SPEC,
    queue_length.SPEC,
)


def default_registry() -> PluginRegistry:
    """A new registry with every in-tree plugin registered (a fresh object each call, never a global)."""
    reg = PluginRegistry()
    for spec in IN_TREE:
        reg.register(spec)
    return reg
