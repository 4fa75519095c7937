"""The plain form of a prefill group's derivation (`EndpointTimeline._group`): one `landed` call per gap
looked at and `statistics.median`, as the timeline derived it before its inline form. Tests pin the
timeline's derivation to it."""

from __future__ import annotations

from statistics import median

from gateway.telemetry.timeline import (
    _DEFER,
    MAX_REFERENCES,
    NEXT_GAPS,
    REGULAR,
    EndpointTimeline,
    PrefillObservation,
)
from gateway.telemetry.timeline_store import StreamArrays, TimedStream


class PlainTimeline(EndpointTimeline):
    """An `EndpointTimeline` whose prefill groups are derived in the plain form."""

    def _group(
        self, arr: StreamArrays, members: list[TimedStream], at0: float, at1: float, before: float
    ) -> PrefillObservation | object | None:
        tol = arr.tol
        size = len(members)
        tokens = sum(s.computed for s in members)
        samples: list[float] = []
        landed, untracked = arr.landed, arr.untracked
        running = ((arr.firsts < at0 - tol) & (arr.lasts >= at1 - tol)).nonzero()[0]
        for k in running.tolist():
            times = self._streams[k].times
            i = int(times.searchsorted(at1 - tol))
            if i < 2 or i + 1 >= len(times):
                continue
            t: list[float] = times[i - 2 : i + NEXT_GAPS + 2].tolist()
            n = len(t)
            if not t[1] + tol < at0 or t[0] <= self.known_from:
                continue
            if landed(t[1], t[2]) != size or landed(t[0], t[1]):
                continue
            m = 0
            while m < NEXT_GAPS and 3 + m < n and landed(t[2 + m], t[3 + m]) == 0:
                m += 1
            if t[min(3 + m, n - 1)] + tol >= before:
                return _DEFER
            if m == 0 or untracked(t[0], t[2 + m]):
                continue
            around = [t[1] - t[0], *(t[3 + j] - t[2 + j] for j in range(m))]
            mid = median(around)
            if mid > tol and all(mid / REGULAR <= g <= mid * REGULAR for g in around):
                samples.append((t[2] - t[1]) - (t[2 + m] - t[2]) / m)
                if len(samples) >= MAX_REFERENCES:
                    break
        if samples:
            seconds = median(samples)
            return PrefillObservation(tokens, seconds, idle=False) if seconds > 0 else None
        return self._idle_group(arr, members, tokens, at0, at1)
