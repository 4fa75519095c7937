"""A model's recent SLO mix, observed request by request: the `TrafficMix` MaaSO's placer
(`gateway.sched.heterogeneous`) takes, from what the sub-cluster filter and the autoscale loop's
configuration choice saw."""

from __future__ import annotations

import math

from gateway.sched.heterogeneous import RequestKind, TrafficMix


class MixWindow:
    """A model's recent SLO mix from the requests it saw: each counts with weight exp(−age / window_s),
    its deadline factor rounded to `bucket` (kinds are (factor bucket, decode-length bucket of 100
    tokens)), and the rate is the decayed count over what a steady rate would have summed to since the
    first observation, ``window_s·(1 − exp(−seen / window_s))`` (unbiased from the first seconds on; the
    plain window over-weighed nothing but read 0.63x the rate one window in), with `seen` at least 1 s.
    Decay is applied on every path that reads or adds (`observe`, `mix`)."""

    def __init__(self, window_s: float = 60.0, bucket: float = 0.1) -> None:
        if window_s <= 0 or bucket <= 0:
            raise ValueError("window_s and bucket must be > 0")
        self.window_s = window_s
        self.bucket = bucket
        self._at: float | None = None
        self._first: float | None = None
        self._weights: dict[tuple[int, int], tuple[float, float]] = {}  # -> (weight, weighted length)

    def observe(self, now: float, factor: float, decode_tokens: float) -> None:
        if not (math.isfinite(factor) and factor > 0 and decode_tokens > 0):
            return
        self._decay(now)
        if self._first is None:
            self._first = now
        key = (round(factor / self.bucket), round(decode_tokens / 100.0))
        w, lw = self._weights.get(key, (0.0, 0.0))
        self._weights[key] = (w + 1.0, lw + decode_tokens)

    def mix(self, now: float, t_slot_s: float, cv: float = 1.0) -> TrafficMix:
        self._decay(now)
        total = sum(w for w, _ in self._weights.values())
        seen = max(1.0, now - (self._first if self._first is not None else now))
        steady = self.window_s * -math.expm1(-seen / self.window_s)  # what rate 1 would have summed to
        kinds = tuple(
            RequestKind(w / total, key[0] * self.bucket, lw / w)
            for key, (w, lw) in sorted(self._weights.items())
            if w > 1e-6
        )
        return TrafficMix(rate=total / steady if total else 0.0, t_slot_s=t_slot_s, kinds=kinds, cv=cv)

    def _decay(self, now: float) -> None:
        if self._at is not None and now > self._at:
            f = math.exp(-(now - self._at) / self.window_s)
            self._weights = {k: (w * f, lw * f) for k, (w, lw) in self._weights.items() if w * f > 1e-6}
        if self._at is None or now > self._at:
            self._at = now
