"""`diag slow-calls`: the hook records the slow calls with their sizes and profile; the report reads them."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson

from loadgen.diag.slow_calls_hook import Recorder
from loadgen.diag.slow_calls_live import load, report, wrapper


class _Sched:
    def __init__(self) -> None:
        self.depth = 3

    def queue_depths(self) -> dict[str, int]:
        return {"m": self.depth}


def _slow(sched: _Sched, n: int) -> list[int]:
    sched.depth -= n
    return list(range(n))


def _records(threshold_s: float) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    out = io.BytesIO()
    rec = Recorder(out, threshold_s)
    rec.queued = lambda s: sum(s.queue_depths().values())
    call = rec.wrap_call("complete", "complete", _slow)
    sched = _Sched()
    assert call(sched, 2) == [0, 1]
    rec.write_totals()
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    totals = lines[-1]["totals"]
    return lines[:-1], totals


def test_every_call_counted_and_slow_ones_recorded() -> None:
    slow, totals = _records(0.0)
    assert totals["complete"]["calls"] == 1
    (r,) = slow
    assert (r["call"], r["nth"], r["queued_before"], r["queued_after"], r["decisions"]) == (
        "complete", 0, 3, 1, 2,
    )  # fmt: skip
    assert r["ms"] >= 0
    assert "functions" in r


def test_fast_calls_not_recorded() -> None:
    slow, totals = _records(10.0)
    assert slow == []
    assert totals["complete"]["calls"] == 1


def test_report_reads_the_records(tmp_path: Path) -> None:
    slow, totals = _records(0.0)
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in [*slow, {"totals": totals}]))
    recs, tot = load(path)
    text = "\n".join(report(recs, tot, 5))
    assert "complete" in text
    assert "q 3->1" in text


def test_wrapper_runs_berth_under_the_hook(tmp_path: Path) -> None:
    text = wrapper(tmp_path / "py.sh", tmp_path / "out.jsonl", 4.0).read_text()
    assert "loadgen.diag.slow_calls_hook" in text
    assert "4.0 gateway.cli" in text
