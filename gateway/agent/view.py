"""The node as one invocation sees it (devices, records, NVML's measures, health), and the reports built
from it: pure functions over a `NodeView`, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.agent import inventory, ledger
from gateway.agent.config import ModelSpec
from gateway.agent.contract import (
    DeviceFit,
    DeviceReport,
    InstanceReport,
    InstanceState,
    PlanReport,
    Victim,
)
from gateway.agent.state import InstanceRecord


@dataclass(frozen=True, slots=True)
class NodeView:
    """The node as one invocation sees it after re-adoption."""

    devices: list[inventory.Device]
    records: list[InstanceRecord]
    measured: dict[str, dict[str, int]]  # instance id -> device -> bytes (NVML only)
    healthy: dict[str, bool]  # instance id -> the probe of this invocation

    @property
    def resident(self) -> list[InstanceRecord]:
        return [r for r in self.records if r.resident]

    def slots(self, headroom: int) -> list[ledger.DeviceSlot]:
        return [ledger.DeviceSlot(d.name, d.index, max(0, d.total_bytes - headroom)) for d in self.devices]

    def holdings(self) -> list[ledger.Holding]:
        return [
            ledger.Holding(
                id=r.id,
                devices=r.devices,
                admitted_bytes=r.memory_bytes,
                measured_bytes=self.measured.get(r.id, {}),
                loading=r.state is InstanceState.STARTING,
                evictable=r.state is InstanceState.READY,
            )
            for r in self.resident
        ]


def plan_report(model: ModelSpec, view: NodeView, headroom_bytes: int) -> PlanReport:
    """`plan MODEL`: whether it fits now, where, and otherwise the fewest ready instances to stop.
    `model` as configured (`ModelSpec.configured`): its devices and memory are the configuration's."""
    slots = view.slots(headroom_bytes)
    holdings = view.holdings()
    book = ledger.books(slots, holdings)
    required = model.memory_bytes
    chosen = ledger.choose(book, required, model.devices)
    per_device = [fit(b, required) for b in book.values()]
    by_id = {r.id: r for r in view.resident}
    victims = [
        Victim(
            id=h.id,
            model=by_id[h.id].model,
            state=by_id[h.id].state,
            devices=list(h.devices),
            frees_bytes=max(h.reserved_on(d) for d in h.devices) if h.devices else 0,
            idle=h.evictable,
        )
        for h in holdings
    ]
    if chosen is not None:
        return PlanReport(
            model=model.name,
            fits=True,
            devices=chosen,
            required_bytes=required,
            devices_needed=model.devices,
            per_device=per_device,
            evict=[],
            evict_devices=chosen,
            victims=victims,
            reason=f"fits on {', '.join(chosen)}",
            config=model.default_config,
        )
    eviction = ledger.plan_eviction(slots, holdings, required, model.devices)
    reason = why_not(model, book)
    if eviction is not None:
        reason += f"; stopping {', '.join(eviction.victims)} would make room on {', '.join(eviction.devices)}"
    else:
        reason += "; stopping ready instances would not make room"
    return PlanReport(
        model=model.name,
        fits=False,
        devices=[],
        required_bytes=required,
        devices_needed=model.devices,
        per_device=per_device,
        evict=list(eviction.victims) if eviction is not None else None,
        evict_devices=eviction.devices if eviction is not None else [],
        victims=victims,
        reason=reason,
        config=model.default_config,
    )


def fit(b: ledger.DeviceBook, required: int) -> DeviceFit:
    return DeviceFit(
        name=b.slot.name,
        capacity_bytes=b.slot.capacity_bytes,
        reserved_bytes=b.reserved_bytes,
        required_bytes=required,
        free_bytes=b.free_bytes,
        fits=b.admits(required),
        loading=b.loading,
    )


def why_not(model: ModelSpec, book: dict[str, ledger.DeviceBook]) -> str:
    parts = ", ".join(
        f"{b.slot.name}: {b.reserved_bytes} reserved + {model.memory_bytes} > {b.slot.capacity_bytes}"
        if b.reserved_bytes + model.memory_bytes > b.slot.capacity_bytes
        else f"{b.slot.name}: loading {b.loading}"
        if b.loading is not None
        else f"{b.slot.name}: fits"
        for b in book.values()
    )
    return f"model {model.name} needs {model.memory_bytes} bytes on {model.devices} device(s) ({parts})"


def device_report(
    d: inventory.Device, b: ledger.DeviceBook, *, headroom_bytes: int, settled_at: float | None
) -> DeviceReport:
    return DeviceReport(
        name=d.name,
        index=d.index,
        source=d.source,
        total_bytes=d.total_bytes,
        headroom_bytes=min(headroom_bytes, d.total_bytes),
        reserved_bytes=b.reserved_bytes,
        free_bytes=b.free_bytes,
        measured_used_bytes=d.used_bytes,
        loading=b.loading,
        settled_at=settled_at,
        instances=list(b.holders),
    )


def instance_report(r: InstanceRecord, view: NodeView, *, healthy: bool | None = None) -> InstanceReport:
    m = view.measured.get(r.id)
    return InstanceReport(
        id=r.id,
        model=r.model,
        engine=r.engine,
        state=r.state,
        url=r.url,
        port=r.port,
        devices=list(r.devices),
        device_indices=list(r.device_indices),
        memory_bytes=r.memory_bytes,
        measured_bytes=max(m.values()) if m else None,
        started_at=r.started_at,
        ready_at=r.ready_at,
        load_s=r.load_s,
        pid=r.pid,
        unit=r.unit,
        healthy=healthy if healthy is not None else view.healthy.get(r.id),
        reason=r.reason,
        stopped_at=r.stopped_at,
        config=r.config,
        max_batch=r.max_batch,
    )
