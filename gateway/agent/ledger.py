"""Per-device memory admission, sans-IO: reserved + required <= total - headroom, one load per device.

`reserved` on a device is, per resident instance on it, what the instance was admitted with, or what NVML
measures for its processes when that is more (an engine that grew past its estimate keeps its real size
in the books). A device with a load in progress takes no new load (settling after a stop is a wait
the caller does before loading, see `gateway.agent.node`).
Everything here is pure: the caller gathers devices and holdings and acts on the answers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

#: Above this many evictable instances, `plan_eviction` stops enumerating subsets and goes greedy.
MAX_EXACT_VICTIMS: Final = 12


@dataclass(frozen=True, slots=True)
class DeviceSlot:
    name: str
    index: int
    capacity_bytes: int  # total - headroom


@dataclass(frozen=True, slots=True)
class Holding:
    """A resident instance as the ledger sees it."""

    id: str
    devices: tuple[str, ...]
    admitted_bytes: int  # per device
    measured_bytes: Mapping[str, int] = field(default_factory=dict)  # per device, from NVML
    loading: bool = False  # in state `starting`
    evictable: bool = True  # ready (not starting or stopping)

    def reserved_on(self, device: str) -> int:
        return max(self.admitted_bytes, self.measured_bytes.get(device, 0))


@dataclass(frozen=True, slots=True)
class DeviceBook:
    slot: DeviceSlot
    reserved_bytes: int
    loading: str | None
    holders: tuple[str, ...]

    @property
    def free_bytes(self) -> int:
        return max(0, self.slot.capacity_bytes - self.reserved_bytes)

    def admits(self, required: int) -> bool:
        return self.loading is None and self.reserved_bytes + required <= self.slot.capacity_bytes


def books(slots: Sequence[DeviceSlot], holdings: Iterable[Holding]) -> dict[str, DeviceBook]:
    """Each device's reservations (holdings on devices the node does not list are ignored)."""
    reserved = {s.name: 0 for s in slots}
    loading: dict[str, str | None] = {s.name: None for s in slots}
    holders: dict[str, list[str]] = {s.name: [] for s in slots}
    for h in holdings:
        for d in h.devices:
            if d not in reserved:
                continue
            reserved[d] += h.reserved_on(d)
            holders[d].append(h.id)
            if h.loading:
                loading[d] = h.id
    return {s.name: DeviceBook(s, reserved[s.name], loading[s.name], tuple(holders[s.name])) for s in slots}


def choose(book: Mapping[str, DeviceBook], required: int, needed: int) -> list[str] | None:
    """`needed` devices that each admit `required` more bytes, packed tightly; None when there are not.

    Best fit: the devices with the least room left after the load, so large holes stay for large models.
    """
    ok = [b for b in book.values() if b.admits(required)]
    if len(ok) < needed:
        return None
    ok.sort(key=lambda b: (b.slot.capacity_bytes - b.reserved_bytes - required, b.slot.index))
    return sorted((b.slot.name for b in ok[:needed]), key=lambda n: book[n].slot.index)


@dataclass(frozen=True, slots=True)
class Eviction:
    victims: tuple[str, ...]
    devices: list[str]  # where the model would load once they are gone
    freed_bytes: int


def plan_eviction(
    slots: Sequence[DeviceSlot], holdings: Sequence[Holding], required: int, needed: int
) -> Eviction | None:
    """The fewest evictable instances (then the fewest bytes freed) whose stop makes the model fit.

    None when not even stopping every evictable instance would (too few devices, a model larger than a
    device, or devices held by loads in progress).
    """
    candidates = [h for h in holdings if h.evictable]
    if len(candidates) <= MAX_EXACT_VICTIMS:
        for size in range(len(candidates) + 1):
            best: Eviction | None = None
            for group in itertools.combinations(candidates, size):
                e = _try(slots, holdings, group, required, needed)
                if e is not None and (best is None or e.freed_bytes < best.freed_bytes):
                    best = e
            if best is not None:
                return best
        return None
    # Greedy: the instances freeing the most first.
    chosen: list[Holding] = []
    for h in sorted(candidates, key=lambda h: -h.admitted_bytes * len(h.devices)):
        e = _try(slots, holdings, chosen, required, needed)
        if e is not None:
            return e
        chosen.append(h)
    return _try(slots, holdings, chosen, required, needed)


def _try(
    slots: Sequence[DeviceSlot],
    holdings: Sequence[Holding],
    victims: Iterable[Holding],
    required: int,
    needed: int,
) -> Eviction | None:
    gone = {v.id for v in victims}
    book = books(slots, (h for h in holdings if h.id not in gone))
    devices = choose(book, required, needed)
    if devices is None:
        return None
    freed = sum(h.reserved_on(d) for h in holdings if h.id in gone for d in h.devices)
    return Eviction(tuple(sorted(gone)), devices, freed)
