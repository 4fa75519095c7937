"""What berth adds to the event loop per request (`loadgen.diag.overhead_hops`), counted on a small run:
no task or future of its own per request, no more task wake-ups than the bare proxy (its engine-call
client saves the one that the handler's yield between its front half and its engine call spends), and no
timer per engine call (its deadlines are swept by one timer for all calls), against the bare proxy on the
same counting loop."""

from __future__ import annotations

from typing import Any

import pytest

from loadgen.diag import overhead_hops
from loadgen.diag.overhead_hops import per_unit, render, totals


@pytest.fixture(scope="module")
def counts() -> dict[str, dict[str, Any]]:
    return {proxy: overhead_hops.count(proxy, 60, 6, 8, 0.001) for proxy in overhead_hops.PROXIES}


#: Sites of berth's time-driven background work (sleeps of the lag monitor, the queue ticker,
#: telemetry and the scrapers, and their tasks' wake-ups): how often they land in the window depends
#: on how long the run takes, not on the requests.
_BACKGROUND = ("core/looplag.py", "dispatch/driver.py:tick_forever", "telemetry/", "core/tasks.py")


def _per_request(counts: dict[str, Any]) -> dict[str, float]:
    out = dict.fromkeys(overhead_hops.KINDS, 0.0)
    for (kind, site), v in per_unit(counts, "request").items():
        if not site.startswith(_BACKGROUND):
            out[kind] += v
    return out


def _sites(counts: dict[str, Any], kind: str) -> list[tuple[str, float]]:
    """Where berth's `kind` per request came from, the most first (what a failure shows)."""
    got = [(site, v) for (k, site), v in per_unit(counts, "request").items() if k == kind]
    return sorted(got, key=lambda sv: -sv[1])[:8]


def test_berth_adds_no_task_future_wakeup_or_timer_per_request(counts: dict[str, dict[str, Any]]) -> None:
    bare, berth = _per_request(counts["bare"]), _per_request(counts["berth"])
    assert bare["task"] > 0  # the counting loop counts
    assert bare["wakeup"] > 0
    for kind in ("task", "future", "timer", "wakeup"):
        # what is left of the background: the scrapes' aiohttp read timers, the deadline sweep's ticks
        assert berth[kind] - bare[kind] < 0.5, (kind, berth, bare, _sites(counts["berth"], kind))


def test_a_stream_adds_no_timer_of_its_own(counts: dict[str, dict[str, Any]]) -> None:
    bare, berth = (per_unit(counts[p], "stream") for p in ("bare", "berth"))
    per_call = {
        site: v for (kind, site), v in berth.items() if kind == "timer" and site.startswith("upstream/")
    }
    assert sum(per_call.values()) < 0.5, per_call  # the sweep's own ticks only, not one per stream
    assert totals(berth)["task"] <= totals(bare)["task"]  # berth's engine-call client starts none
    text = render({"t": counts})
    assert "per non-streamed request" in text
    assert "per stream of 8 chunks" in text
