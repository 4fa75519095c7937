"""The stall watcher's bookkeeping of stalls: a stack snapshot cut to the callback that was running and
named by its site, and the log that opens a stall when a beat is late, collects a snapshot per look and
closes it at the next beat with its gap and the main thread's CPU over it (`StallLog`).
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

#: Frames of the machinery that runs the loop (outermost), cut from each snapshot before the callback.
RUNNER_FILES: Final = (
    "/asyncio/runners.py",
    "/asyncio/base_events.py",
    "/asyncio/events.py",
    "/uvloop/",
    "/runpy.py",
)
#: Our code: the innermost of its frames names a site better than a library's frame does.
OWN: Final = ("/gateway/", "/loadgen/")

Frame = tuple[str, int, str]  # file, line, function


def _frame(f: types.FrameType, line: int) -> Frame:
    return (f.f_code.co_filename, line, f.f_code.co_name)


def frames_of(top: types.FrameType | None) -> list[Frame]:
    """A stack, outermost first."""
    out: list[Frame] = []
    f = top
    while f is not None:
        out.append(_frame(f, f.f_lineno))
        f = f.f_back
    out.reverse()
    return out


def callback_part(stack: Sequence[Frame]) -> list[Frame]:
    """The frames of the callback the loop was running: those after the last frame of the runner and
    the launcher (empty: the loop itself, e.g. waiting in epoll or in its C code)."""
    last = -1
    for i, (filename, _, _) in enumerate(stack):
        if any(part in filename for part in RUNNER_FILES) or filename == __file__:
            last = i
    return list(stack[last + 1 :])


def _short(frame: Frame) -> str:
    filename, line, func = frame
    for marker in ("/site-packages/", "/gateway/", "/loadgen/", "/lib/python3"):
        if marker in filename:
            root = marker.strip("/")
            rest = filename.split(marker, 1)[1]
            filename = rest if root in ("site-packages", "lib/python3") else f"{root}/{rest}"
            break
    return f"{func} ({filename}:{line})"


def site_of(callback: Sequence[Frame]) -> tuple[str, str, str]:
    """(callback root, our innermost frame, innermost frame) of a snapshot's callback frames."""
    if not callback:
        return ("<loop>", "", "")
    own = [f for f in callback if any(p in f[0] for p in OWN)]
    return (_short(callback[0]), _short(own[-1]) if own else "", _short(callback[-1]))


#: A stall is work on the loop (not a wait for a CPU) when the main thread ran at least this share of it.
BUSY_SHARE: Final = 0.5


@dataclass(frozen=True, slots=True)
class Beat:
    wall: float  # perf_counter
    cpu: float  # the main thread's CPU time (thread_time)


@dataclass(slots=True)
class Stall:
    started: float  # when the beat it waited for was due (perf_counter)
    snapshots: list[list[Frame]] = field(default_factory=list)
    gap_s: float = 0.0  # beat to beat, set when the next beat came
    cpu_s: float = 0.0  # the main thread's CPU time over the gap

    @property
    def busy(self) -> bool:
        return self.cpu_s >= BUSY_SHARE * self.gap_s


@dataclass(slots=True)
class StallLog:
    """Stalls as the watchdog saw them; pure bookkeeping (tested with a scripted clock)."""

    beat_s: float
    threshold_s: float
    stalls: list[Stall] = field(default_factory=list)
    _open: Stall | None = None
    _seen: Beat | None = None

    def poll(self, now: float, last: Beat, snapshot: Callable[[], list[Frame]]) -> None:
        """One look: close a stall once a new beat came; snapshot while the beat is late."""
        seen = self._seen
        if self._open is not None and seen is not None and last != seen:
            self._open.gap_s = last.wall - seen.wall
            self._open.cpu_s = last.cpu - seen.cpu
            self.stalls.append(self._open)
            self._open = None
        self._seen = last
        if now - last.wall > self.beat_s + self.threshold_s:
            if self._open is None:
                self._open = Stall(started=last.wall + self.beat_s)
            self._open.snapshots.append(snapshot())

    def report(self, top: int = 25, gc_ended: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
        """Snapshots counted by site, the longest stalls with their sites and the collector's CPU within
        them (`gc_ended`: (ended at, seconds) of the long collections)."""
        sites: Counter[tuple[str, str, str]] = Counter()
        stalls_at: Counter[tuple[str, str, str]] = Counter()
        busy = [s for s in self.stalls if s.busy]
        for stall in busy:
            seen = [site_of(callback_part(s)) for s in stall.snapshots]
            sites.update(seen)
            stalls_at.update(set(seen))
        longest = sorted(busy, key=lambda s: s.cpu_s, reverse=True)[:top]
        return {
            "beat_ms": self.beat_s * 1000,
            "threshold_ms": self.threshold_s * 1000,
            "stalls": len(self.stalls),
            "stalled_ms": round(sum(s.gap_s for s in self.stalls) * 1000, 3),
            "busy_stalls": len(busy),
            "busy_stalled_ms": round(sum(s.gap_s for s in busy) * 1000, 3),
            "busy_cpu_ms": sorted((round(s.cpu_s * 1000, 3) for s in busy), reverse=True),
            "sites": [
                {"root": r, "own": o, "leaf": leaf, "snapshots": n, "stalls": stalls_at[(r, o, leaf)]}
                for (r, o, leaf), n in sites.most_common(top)
            ],
            "longest": [
                {
                    "gap_ms": round(s.gap_s * 1000, 3),
                    "cpu_ms": round(s.cpu_s * 1000, 3),
                    "gc_ms": round(
                        1000
                        * sum(
                            t for end, t in gc_ended if s.started - self.beat_s < end <= s.started + s.gap_s
                        ),
                        3,
                    ),
                    "sites": [list(site_of(callback_part(snap))) for snap in s.snapshots],
                    "stack": [_short(f) for f in callback_part(s.snapshots[0])] if s.snapshots else [],
                }
                for s in longest
            ],
        }
