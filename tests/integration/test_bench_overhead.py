"""The overhead benchmark (`berth-loadgen bench overhead --quick`) end to end: every figure of its
targets comes out of one command, with a verdict (the values are a shared machine's and not judged)."""

from __future__ import annotations

from pathlib import Path

import orjson

from loadgen.bench.overhead import proxy as overhead
from loadgen.bench.overhead.overhead_report import CONFIGS, FLEET, PHASES, QUEUE


def test_the_quick_run_measures_every_target(tmp_path: Path) -> None:
    out = tmp_path / "overhead"
    assert overhead.main(["--quick", "--out", str(out)]) == 0
    doc = orjson.loads((out / "report.json").read_bytes())
    assert doc["unavailable"] == {}
    names = [t["name"] for t in doc["targets"]]
    assert len(names) == 8
    assert any("endpoints scraped" in n for n in names)
    # A ratio of added figures has no value when the bare proxy added nothing measurable in this run
    # (its p99 under direct's: one quick round on a shared machine); every other target has one.
    bare = doc["summary"]["bare"]
    unmeasured = {
        "added p99, berth ÷ bare (c=8)": bare["added_p99_c8_ms"],
        "added TTFC, berth ÷ bare (8 streams)": bare["added_ttfc_p50_ms"],
    }
    for target in doc["targets"]:
        if target["value"] is None:
            assert target["name"] in unmeasured, target["name"]
            assert unmeasured[target["name"]] <= 0.0, target
            assert target["verdict"] == "N/A"
        else:
            assert target["verdict"] in ("PASS", "FAIL")
    missing = any(t["value"] is None for t in doc["targets"])
    assert doc["verdict"] in (("INCOMPLETE",) if missing else ("PASS", "FAIL"))
    seen = {(m["phase"], m["config"]) for m in doc["measurements"]}
    assert seen >= {(p, c) for p in PHASES for c in CONFIGS}
    assert {(FLEET, "bare"), (FLEET, "berth")} <= seen
    for m in doc["measurements"]:
        assert m["errors"] == 0, m
        assert m["completed"] > 0, m
        # Both proxies run the same lag monitor; the client talking to the upstream has none.
        assert bool(m["lag_s"]) == (m["config"] != "direct"), m
        assert all(lag >= 0.0 for lag in m["lag_s"]), m
    assert (out / "report.md").read_text().startswith("# berth overhead benchmark")


def test_the_standing_queue_phase_measures_both_proxies_and_berths_decisions(tmp_path: Path) -> None:
    out = tmp_path / "queue"
    assert overhead.main(["--quick", "--tests", "queue", "--out", str(out)]) == 0
    doc = orjson.loads((out / "report.json").read_bytes())
    assert doc["unavailable"] == {}
    assert [t["name"].split(",")[0] for t in doc["targets"]] == [
        "event-loop lag p99",
        "longest scheduler call",
    ]
    for target in doc["targets"]:
        assert target["value"] is not None, target["name"]
    by_config = {m["config"]: m for m in doc["measurements"]}
    assert set(by_config) == {"bare", "berth"}
    for m in by_config.values():
        assert m["phase"] == QUEUE
        assert m["lag_s"], m["config"]
        assert m["completed"] > 0, m
    decisions = by_config["berth"]["decisions"]
    assert decisions["submit"]["calls"] > 0
    assert decisions["all"]["queued_before"] > 0  # a queue stood
    assert by_config["bare"]["decisions"] == {}  # the bare proxy has no scheduler
    assert "standing queue" in doc["table"]
