"""berth's event-loop lag as the overhead benchmark reads it: the cumulative `berth_event_loop_lag_seconds`
histogram from a running berth's `/metrics`, read before and after a phase (`overhead_report.lag_p99_ms`
turns two readings into the phase's p99)."""

from __future__ import annotations

import re
import urllib.request
from typing import Final

_LAG_BUCKET: Final = re.compile(rb'^berth_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([0-9.e+-]+)$', re.M)


def lag_histogram(base_url: str, timeout_s: float = 5.0) -> dict[float, float] | None:
    """berth's cumulative event-loop lag histogram (`le` in seconds -> samples, +Inf included); None
    when it cannot be read (berth not running, or no such metric)."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=timeout_s) as resp:
            text = resp.read()
    except OSError:
        return None
    return {float(le): float(n) for le, n in _LAG_BUCKET.findall(text)} or None
