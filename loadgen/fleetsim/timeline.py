"""The fleet over time, sampled every few virtual seconds: how many endpoints were busy (running at least
one request: CATO's utilization), requests running and waiting in the engines, queued in berth, and the
concurrency caps in force, summed per instance class (they move under an adaptive controller). With a
lifecycle the endpoint count moves too: each sample also keeps the endpoints then, the devices held
(loading instances included) and the ready instances per class, and utilization is busy over the
endpoints of each sample; device utilization is the devices of the busy endpoints over the devices held
(busy device-seconds over device-seconds provisioned, loading instances included)."""

from __future__ import annotations

from array import array
from typing import Any


class FleetTimeline:
    __slots__ = (
        "_busy",
        "_busy_devices",
        "_by_class",
        "_caps",
        "_devices",
        "_endpoints",
        "_queued",
        "_running",
        "_t",
        "_waiting",
        "n_endpoints",
    )

    def __init__(self, n_endpoints: int) -> None:
        self.n_endpoints = n_endpoints
        self._t = array("d")
        self._busy = array("l")
        self._running = array("l")
        self._waiting = array("l")
        self._queued = array("l")
        self._caps: dict[str, array[int]] = {}
        self._endpoints = array("l")
        self._devices = array("l")
        self._busy_devices = array("l")
        self._by_class: dict[str, array[int]] = {}

    def __len__(self) -> int:
        return len(self._t)

    def add(  # noqa: PLR0917  # one sample's figures, in the order of the summary
        self,
        t: float,
        busy: int,
        running: int,
        waiting: int,
        queued: int,
        caps: dict[str, int] | None = None,
        *,
        endpoints: int | None = None,
        devices: int | None = None,
        busy_devices: int | None = None,
        by_class: dict[str, int] | None = None,
    ) -> None:
        n = len(self._t)
        for table, figures in ((self._caps, caps), (self._by_class, by_class)):
            for cls, v in (figures or {}).items():
                series = table.get(cls)
                if series is None:
                    series = table[cls] = array("l", [0] * n)
                series.append(v)
            for series in table.values():
                if len(series) == n:  # a class without a figure this time
                    series.append(0)
        self._endpoints.append(self.n_endpoints if endpoints is None else endpoints)
        self._devices.append(0 if devices is None else devices)
        self._busy_devices.append(0 if busy_devices is None else busy_devices)
        self._t.append(t)
        self._busy.append(busy)
        self._running.append(running)
        self._waiting.append(waiting)
        self._queued.append(queued)

    def utilization(self) -> float | None:
        """The mean share of endpoints busy over the samples."""
        total = sum(self._endpoints)
        if not self._t or not total:
            return None
        return sum(self._busy) / total

    def device_utilization(self) -> float | None:
        """Busy devices over the devices held, summed over the samples (None without a lifecycle)."""
        total = sum(self._devices)
        return sum(self._busy_devices) / total if total else None

    def summary(self, n_endpoints: int) -> dict[str, Any]:
        util = self.utilization()
        dev = self.device_utilization()
        return {
            "endpoints": n_endpoints,
            "utilization": None if util is None else round(util, 4),
            "device_utilization": None if dev is None else round(dev, 4),
            "queued_max": max(self._queued, default=0),
            "timeline": {
                "t_s": [round(t, 3) for t in self._t],
                "busy_endpoints": list(self._busy),
                "engine_running": list(self._running),
                "engine_waiting": list(self._waiting),
                "gateway_queued": list(self._queued),
                "caps_by_class": {cls: list(v) for cls, v in self._caps.items()},
                "endpoints": list(self._endpoints),
                "devices": list(self._devices),
                "instances_by_class": {cls: list(v) for cls, v in self._by_class.items()},
            },
        }
