"""What several scalers share: which instances to retire first, and an instance's seats."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.sched.plugins.autoscale.interface import InstanceView, ScaleState


def ready(instances: Iterable[InstanceView]) -> list[InstanceView]:
    return [i for i in instances if i.state is ScaleState.READY]


def retire_order(instances: Iterable[InstanceView]) -> list[InstanceView]:
    """Ready instances, the cheapest to retire first: idle ones (longest idle first), then the least
    busy, then the newest (ties by id, so the choice is deterministic)."""
    return sorted(
        ready(instances),
        key=lambda i: (
            i.idle_since is None,
            i.idle_since if i.idle_since is not None else 0.0,
            i.running,
            -(i.ready_at or 0.0),
            i.id,
        ),
    )


def seats(instances: Sequence[InstanceView], default: int) -> float:
    """The mean concurrency cap of the ready instances that report one, else `default`."""
    caps = [i.cap for i in instances if i.cap is not None and i.state is ScaleState.READY]
    return sum(caps) / len(caps) if caps else float(default)


def idle_for(inst: InstanceView, now: float) -> float:
    """Seconds it has run nothing (0 while busy)."""
    return 0.0 if inst.idle_since is None else max(0.0, now - inst.idle_since)
