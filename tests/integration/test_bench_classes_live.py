"""`berth-loadgen bench classes --live` end to end at a tiny scale: the engine simulator and berth as
processes over loopback, (a) and (d) each beside the simulator's run of the same setting, one report
(the figures are a shared machine's and not judged here)."""

from __future__ import annotations

from pathlib import Path

import orjson

from loadgen.bench.scheduling import classes
from loadgen.cli import main as loadgen_main

BACKLOG = 4


def test_the_live_run_reports_both_paths_side_by_side(tmp_path: Path) -> None:
    argv = ["--live", "--out", str(tmp_path), "--rates", "1", "--backlog", str(BACKLOG)]
    assert loadgen_main(["bench", "classes", *argv, "--duration", "6", "--speed", "4"]) == 0
    doc = orjson.loads((tmp_path / "report.json").read_bytes())
    assert doc["setup"]["speed"] == 4.0
    sims = {r["config"]: r for r in doc["sim"]}
    lives = {r["config"]: r for r in doc["live"]}
    assert set(sims) == set(lives) == {classes.BASELINE, classes.BERTH}
    for config, live in lives.items():
        sim = sims[config]
        # the same trace on both paths, every request answered live
        assert live["interactive_requests"] == sim["interactive_requests"] > 0
        assert live["batch_requests"] == sim["batch_requests"] == BACKLOG
        assert live["batch_finished"] == BACKLOG
        assert live["errors"] == {}
        assert live["berth_rejections"] == 0
        assert live["backlog_done_s"] is not None
        # berth's counters were read (-1: its /metrics could not be)
        assert min(live["preemptions"], live["resumes"], live["recomputed_tokens"]) >= 0
        # the fleet over time, from /admin/fleet, in simulated seconds
        tl = live["timeline"]
        assert tl["t_s"]
        assert set(tl["caps_by_class"]) == {"interactive", "mixed", "batch"}
        assert set(live["cpu"]) == {"berth", "loadgen", "sim"}
        assert isinstance(live["valid"], bool)
        assert (tmp_path / "live" / f"{config}-r1-s0" / "berth.log").exists()
    assert doc["verdict"]["verdict"] in ("CONFIRMS", "DIFFERS", "NOT JUDGED")
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Instance classes: the confirming live run")
    assert "## Validity (live)" in report
