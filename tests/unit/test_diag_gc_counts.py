"""The gc-counts diagnostic (`berth-loadgen diag gc-counts`): the hook's records of the collector calls
the daemon's schedule makes, in this process, and the summary of a run's records (the walks, the guard's
lists against the collections, the estimate of the frozen objects from the net counts)."""

from __future__ import annotations

import gc
import io
from typing import Any

import orjson

from gateway.core.heap import YOUNG_MAX_OBJECTS
from loadgen.diag import gc_counts
from loadgen.diag.gc_counts_hook import GcCalls


def test_the_hook_records_each_call_and_answers_as_gc_does() -> None:
    out = io.BytesIO()
    calls = GcCalls(out, truth_every_s=0.0)
    saved = gc.get_freeze_count, gc.get_objects, gc.collect, gc.freeze
    calls.install()
    try:
        assert gc.get_freeze_count() == saved[0]()
        young = gc.get_objects(0)
        assert isinstance(young, list)
        del young
        assert gc.collect(0) >= 0
    finally:
        gc.get_freeze_count, gc.get_objects, gc.collect, gc.freeze = saved
    recs = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert [r["k"] for r in recs] == ["frozen", "young", "collect"]
    assert recs[2]["gen"] == 0
    assert recs[2]["s"] >= 0.0
    assert all(r["at"] > 0 for r in recs)


def _rec(k: str, at: float, **kw: Any) -> dict[str, Any]:
    return {"k": k, "at": at, **kw}


def test_the_summary_compares_the_frozen_objects_with_the_estimate_from_net_counts() -> None:
    recs = [
        _rec("collect", 0.0, gen=2, net=5, garbage=0, s=0.01),  # before settle's walk: left out
        _rec("frozen", 1.0, n=1_000, s=0.001),  # settle
        _rec("freeze", 1.1, net=300),
        _rec("young", 1.2, n=YOUNG_MAX_OBJECTS + 1, s=0.002),  # over the bound: put off
        _rec("freeze", 1.2, net=50),
        _rec("young", 1.25, n=2_000, s=0.0005),
        _rec("collect", 1.25, gen=0, net=40, garbage=10, s=0.001),
        _rec("freeze", 1.25, net=0),
        _rec("truth", 1.25, n=1_500, s=0.004),
        _rec("frozen", 2.0, n=1_500, s=0.004),  # a growth check: the estimate runs on
        _rec("freeze", 2.1, net=100),
        _rec("truth", 2.1, n=1_450, s=0.004),
        _rec("collect", 3.0, gen=2, net=0, garbage=0, s=0.2),
        _rec("frozen", 3.2, n=1_200, s=0.003),  # after a full collection: both start again
        _rec("freeze", 3.3, net=20),
        _rec("truth", 3.3, n=1_230, s=0.003),
    ]
    doc = gc_counts.summarize(gc_counts.load_records(recs))
    assert [w["objects"] for w in doc["frozen_walks"]] == [1_000, 1_500, 1_200]
    assert doc["young_lists"]["over_bound"] == 1
    assert doc["young_lists"]["objects"]["n"] == 2
    assert doc["young_collections"]["ns_per_object"]["median"] == 500.0  # 1 ms over 2,000 objects
    assert [
        (c["frozen"], c["estimate"], c["growth"], c["estimated_growth"])
        for c in doc["frozen_against_estimate"]
    ] == [
        (1_500, 1_380, 500, 380),  # 1,000 + 300 + 50 + (40 - 10) + 0
        (1_450, 1_480, 450, 480),
        (1_230, 1_220, 30, 20),
    ]
