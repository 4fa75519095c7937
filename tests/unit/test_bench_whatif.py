"""The what-if benchmark: a tiny fleet end to end, and the `berth-loadgen sim` command it prints reruns a
run to the same report."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

import orjson

from loadgen.bench.scheduling.whatif import WhatIfConfig, fleet_toml, main
from loadgen.cli import main as loadgen_main
from loadgen.engine_sim.fleet import parse_fleet
from loadgen.fleetsim.sim import LEFT_OUT


def without_wall(data: dict[str, Any]) -> dict[str, Any]:
    out = dict(data)
    out["simulation"] = {
        k: v for k, v in data["simulation"].items() if k not in ("wall_s", "events_per_s", "requests_per_s")
    }
    return out


def test_the_fleet_file_splits_the_endpoints_between_the_models() -> None:
    specs = parse_fleet(tomllib.loads(fleet_toml(160, 40)))
    assert len(specs) == 200
    assert sum(1 for s in specs if s.models == ("code-a-7b",)) == 160
    assert {s.cap for s in specs} == {16}
    assert {s.scheduling_policy for s in specs} == {"priority"}
    assert len({s.id for s in specs}) == 200


def test_the_traffic_is_ten_times_the_scheduling_benchmarks_highest_rate() -> None:
    cfg = WhatIfConfig(out=Path("x"))
    assert cfg.rate("pattern1") == 105.0
    assert cfg.rate("pattern2") == 75.0


def test_a_tiny_what_if_end_to_end(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    out = Path("whatif")
    argv = ["--endpoints", "6", "--scale", "0.4", "--duration", "6", "--patterns", "pattern1"]
    assert main([*argv, "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert text.index(LEFT_OUT[0]) < text.index("## Setup")
    doc = orjson.loads((out / "report.json").read_bytes())
    assert doc["left_out"] == list(LEFT_OUT)
    assert [(r["pattern"], r["policy"]) for r in doc["runs"]] == [
        ("pattern1", "berth"),
        ("pattern1", "least-outstanding"),
    ]
    for r in doc["runs"]:
        assert r["tasks"] > 0
        assert r["task_goodput"] is not None
        assert r["wall_s"] >= 0
    # the printed command reruns the baseline's run from the files left in DIR, to the same report
    cmd = shlex.split(doc["commands"][1])
    assert cmd[:2] == ["berth-loadgen", "sim"]
    rerun = tmp_path / "rerun.json"
    cmd[cmd.index("--out") + 1] = str(rerun)
    assert loadgen_main([*cmd[1:], "-q"]) == 0
    first = orjson.loads((out / "runs" / "pattern1-least-outstanding.json").read_bytes())
    again = orjson.loads(rerun.read_bytes())
    assert without_wall(first) == without_wall(again)


def test_berth_loadgen_bench_runs_both(tmp_path: Path) -> None:
    # the command line reaches each benchmark's own parser (which refuses these before running anything)
    assert loadgen_main(["bench", "whatif", "--patterns", "pattern9", "--out", str(tmp_path)]) == 2
    assert loadgen_main(["bench", "aladdin", "--policies", "nope", "--out", str(tmp_path)]) == 2
