"""Rolling SLO attainment per SLO class: requests finished and how many met their SLO, over the last
`window_s` seconds (one minute by default).

Per class, two `RateMeter`s (requests finished, requests that met their SLO) keep the window in
`bucket_s` buckets, so recording a request is O(1) and a reading sums at most `window_s / bucket_s`
buckets. Sans-IO: the caller passes the clock time.

What "met" means lives in `meets_slo`: the request finished ok, and each target its SLO sets (TTFT,
mean inter-token latency, end-to-end deadline) was kept. A request without targets (the default SLO)
meets it exactly when it finished ok. It counts by whatever class string the request carries.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.types import SLO
from gateway.telemetry.rolling import RateMeter


def meets_slo(slo: SLO, ok: bool, ttft_s: float | None, itl_s: float | None, e2e_s: float | None) -> bool:
    """Whether a finished request met `slo`. A target with no measurement (e.g. ITL of a one-token or
    non-streamed answer) is not held against the request, except TTFT/E2E which every ok request has."""
    if not ok:
        return False
    if slo.ttft_ms is not None and (ttft_s is None or ttft_s * 1000.0 > slo.ttft_ms):
        return False
    if slo.itl_ms is not None and itl_s is not None and itl_s * 1000.0 > slo.itl_ms:
        return False
    return not (slo.deadline_ms is not None and (e2e_s is None or e2e_s * 1000.0 > slo.deadline_ms))


@dataclass(frozen=True, slots=True)
class ClassAttainment:
    finished: int
    met: int

    @property
    def ratio(self) -> float | None:
        """Share of finished requests that met their SLO; None when none finished."""
        return self.met / self.finished if self.finished else None


class SloAttainment:
    def __init__(self, *, window_s: float = 60.0, bucket_s: float = 1.0) -> None:
        if not bucket_s > 0 or not window_s >= bucket_s:
            raise ValueError("need 0 < bucket_s <= window_s")
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._meters: dict[str, tuple[RateMeter, RateMeter]] = {}  # class -> (finished, met)
        self._totals: dict[str, list[int]] = {}  # class -> [finished, met] since start

    def record(self, slo_class: str, met: bool, now: float) -> None:
        meters = self._meters.get(slo_class)
        if meters is None:
            meters = self._meters[slo_class] = (
                RateMeter(window_s=self.window_s, bucket_s=self.bucket_s),
                RateMeter(window_s=self.window_s, bucket_s=self.bucket_s),
            )
            self._totals[slo_class] = [0, 0]
        total = self._totals[slo_class]
        total[0] += 1
        total[1] += met
        meters[0].add(1.0, now)
        if met:
            meters[1].add(1.0, now)

    def totals(self) -> dict[str, ClassAttainment]:
        """Requests finished and met per class since start (Prometheus counters: goodput per class)."""
        return {cls: ClassAttainment(f, m) for cls, (f, m) in sorted(self._totals.items())}

    def by_class(self, now: float) -> dict[str, ClassAttainment]:
        """Every class seen so far (classes idle for the whole window report 0 finished)."""
        return {
            cls: ClassAttainment(round(finished.total(now)), round(met.total(now)))
            for cls, (finished, met) in sorted(self._meters.items())
        }
