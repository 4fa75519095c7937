"""The simulator under the daemon's collector schedule (`SimOptions.collector`, `loadgen.fleetsim.collector`),
and the young collections a fixed run sets off under CPython's own thresholds (an allocation guard)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions, simulate
from loadgen.fleetsim.collector import GcTally
from loadgen.fleetsim.sim import Simulation

POLICIES = Path(__file__).resolve().parents[2] / "policies"
#: Young collections a warm run of `_opts(100)` may set off under CPython's default thresholds: 22 when
#: this was written (189 requests). A decision that holds as many new objects as the young threshold
#: (700), say every endpoint's load made before any is judged, sets one off per placement: 189 or more.
YOUNG_BOUND = 60


def _opts(endpoints: int, **kw: Any) -> SimOptions:
    fleet = tuple(
        EndpointSpec(models=("m",), profile="fleet-7b", seed=i, id=f"e{i}") for i in range(endpoints)
    )
    base: dict[str, Any] = {
        "policy": POLICIES / "coding-assistant.toml",
        "fleet": fleet,
        "workload": "sharegpt-like",
        "rate": 25.0,
        "duration_s": 8.0,
        "seed": 3,
        "models": ("m",),
    }
    return SimOptions(**{**base, **kw})


def _report(opts: SimOptions) -> bytes:
    data = simulate(opts).data
    sim = data["simulation"]
    timed = ("wall_s", "events_per_s", "requests_per_s")
    data["simulation"] = {k: v for k, v in sim.items() if k not in timed}
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)


@pytest.fixture
def default_thresholds() -> Iterator[None]:
    old = gc.get_threshold()
    gc.collect()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def test_the_same_report_under_the_daemons_collector_schedule() -> None:
    opts = _opts(12, rate=6.0, duration_s=20.0)
    assert _report(opts) == _report(_opts(12, rate=6.0, duration_s=20.0, collector="daemon"))


def test_under_the_daemons_schedule_every_collection_is_the_schedules(default_thresholds: None) -> None:
    before = gc.get_threshold()
    sim = Simulation(_opts(100, collector="daemon"))
    sim.run()
    collector = sim.collector
    assert collector is not None
    schedule, tally = collector.schedule, collector.tally
    # young: the schedule's probes only (CPython's own threshold is the backstop's, never reached);
    # none of the middle generation; full: the settle's and the schedule's own
    assert tally.count[0] == schedule.young_collections
    assert tally.count[1] == 0
    assert tally.count[2] == 1 + schedule.full_collections + schedule.idle_collections
    assert gc.get_threshold() == before  # handed back
    assert gc.get_freeze_count() == 0


def test_a_fixed_run_sets_off_few_young_collections(default_thresholds: None) -> None:
    """An allocation guard: under CPython's default young threshold, a warm run of 189 requests over
    100 endpoints sets off few young collections (`YOUNG_BOUND`). A placement that held hundreds of new
    objects at once would set one off nearly every decision."""
    simulate(_opts(100))  # warm: imports, caches, the policy's first objects
    gc.collect()
    with GcTally() as tally:
        report = simulate(_opts(100))
    assert report.data["overall"]["count"] == 189
    assert tally.count[0] <= YOUNG_BOUND, tally.count
