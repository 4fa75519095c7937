"""`berth-loadgen bench prefix --quick` on the fleet simulator at a tiny scale: the report's shape, every
configuration on the same schedule, the targets' arithmetic, and the command line's refusals."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.bench.scheduling import prefix, prefix_report, prefix_setup
from loadgen.cli import main as loadgen_main
from loadgen.engine_sim.fleet import parse_fleet
from loadgen.engine_sim.profiles import get_profile


def test_quick_run_reports_every_configuration_on_the_same_trace(tmp_path: Path, capsys: Any) -> None:
    argv = ["bench", "prefix", "--quick", "--duration", "8", "--endpoints", "2", "--out", str(tmp_path)]
    assert loadgen_main(argv) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1] in ("verdict: PASS", "verdict: FAIL")
    doc = orjson.loads((tmp_path / "report.json").read_bytes())
    setup = doc["setup"]
    assert setup["workloads"] == ["chat"]
    assert setup["seeds"] == 2
    assert len(setup["loads"]) == 1
    runs = doc["runs"]
    assert len(runs) == len(prefix_setup.CONFIGS) * 2
    for seed in (0, 1):
        same = {r["schedule"] for r in runs if r["seed"] == seed}
        assert len(same) == 1  # every configuration replayed the seed's schedule
        assert {r["config"] for r in runs if r["seed"] == seed} == set(prefix_setup.CONFIGS)
    for r in runs:
        assert r["requests"] > 0
        assert 0.0 <= r["goodput"] <= 1.0
        assert r["ttft_p50_ms"] <= r["ttft_p90_ms"] <= r["ttft_p99_ms"]
        assert 0.0 <= r["hit_rate"] <= 1.0  # the engines cache prefixes: every run counts queries
    key = f"chat@{setup['loads'][0]:g}"
    cell = doc["summary"][key]["berth"]
    assert set(prefix_report.METRICS) <= set(cell)
    assert cell["goodput"]["n"] == 2
    assert cell["goodput"]["half"] is not None
    assert set(doc["bounds"][key]) == {
        "load",
        "load_perfect_cache",
        "reusable_share",
        "goodput_bound",
        "ttft_p90_floor_ms",
    }
    assert 0.0 <= doc["bounds"][key]["goodput_bound"]["goodput"] <= 1.0
    assert doc["bounds"][key]["load_perfect_cache"] <= doc["bounds"][key]["load"]
    targets = [c["target"] for c in doc["verdicts"]["chat"]]
    assert any("hit rate" in t for t in targets)
    assert any("day one" in t for t in targets)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Prefix-cache benchmark")
    assert "| berth |" in md
    assert "| oracle |" in md
    assert (tmp_path / "runs" / f"chat-l{setup['loads'][0]:g}-s0-berth" / "policy.toml").exists()


def _summary(goodputs: dict[str, list[float]]) -> prefix_report.Summary:
    runs = [
        {"workload": "chat", "load": load, "config": c, "seed": 0, "schedule": "x", "goodput": g,
         "ttft_p90_ms": 1000.0 * (1.0 - g) + 10.0, "hit_rate": 0.5}
        for c, gs in goodputs.items()
        for load, g in zip((1.0, 2.0), gs, strict=True)
    ]  # fmt: skip
    return prefix_report.summarize_runs(runs)


def test_targets_are_judged_where_the_best_peer_falls_below_090() -> None:
    s = _summary({"berth": [1.0, 0.95], "least-outstanding": [0.95, 0.7], "prefix-affinity": [0.97, 0.8]})
    assert prefix_report.best_peer(s, "chat@2") == "prefix-affinity"
    assert prefix_report.target_load(s, "chat", [1.0, 2.0]) == (2.0, True)
    result = {"summary": s, "setup": {"loads": [1.0, 2.0], "configs": ["berth", "prefix-affinity"],
                                      "workloads": ["chat"]}}  # fmt: skip
    checks = prefix_report.verdicts(result)["chat"]
    assert checks[0]["passed"]
    assert checks[0]["bound"] == pytest.approx(0.9)
    assert checks[1]["passed"]  # TTFT p90 60 ms <= 0.5 x 210 ms
    s2 = _summary({"berth": [1.0, 1.0], "prefix-affinity": [0.99, 0.95]})
    assert prefix_report.target_load(s2, "chat", [1.0, 2.0]) == (2.0, False)


def test_mean_is_nan_for_a_configuration_that_did_not_run() -> None:
    s = _summary({"berth": [1.0, 1.0]})
    assert math.isnan(prefix_report._mean(s, "chat@1", "oracle", "goodput"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workloads", "nope"], "unknown workloads nope"),
        (["--configs", "berth,nope"], "unknown configurations nope"),
        (["--seeds", "0"], "seeds >= 1"),
        (["--workloads", "mooncake", "--trace", "/nonexistent.jsonl"], "no trace at"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, argv: list[str], message: str) -> None:
    args = prefix.build_parser().parse_args(["--out", str(tmp_path), *argv])
    with pytest.raises(ValueError, match=message):
        prefix.config_from_args(args)


def test_loads_set_rates_in_proportion() -> None:
    trace = prefix_setup.trace_path(None)
    one = prefix_setup.load_for("sharegpt-like", trace, 1.0, 30.0, 4)
    two = prefix_setup.load_for("sharegpt-like", trace, 2.0, 30.0, 4)
    assert two.rate == pytest.approx(2.0 * one.rate)
    assert one.time_scale is None


def test_coding_baselines_get_the_coding_class_table() -> None:
    text = prefix_setup.policy_text("coding", "least-outstanding")
    assert "least-outstanding" in text
    assert 'name = "completion"' in text
    assert (
        prefix_setup.policy_text("chat", "berth")
        == (prefix_setup.POLICY_DIR / "chat-and-batch.toml").read_text()
    )


def test_free_prefill_engines_and_prior_cost_nothing_per_prompt_token() -> None:

    plain = parse_fleet(tomllib.loads(prefix_setup.fleet_file(2)))
    free = parse_fleet(tomllib.loads(prefix_setup.fleet_file(2, free_prefill=True)))
    assert len(free) == 2
    lat = free[0].latency
    assert lat is not None
    assert plain[0].latency is None  # the profile's own
    assert lat == dataclasses.replace(get_profile(prefix_setup.PROFILE).latency, k1=0.0)
    prior = tomllib.loads(prefix_setup.gateway_toml(day_one=False, free_prefill=True))["telemetry"]["prior"]
    assert prior["k1"] == 0.0
    assert tomllib.loads(prefix_setup.gateway_toml(day_one=False))["telemetry"]["prior"]["k1"] > 0.0
    assert prefix_setup.CONFIGS["free-prefill"].free_prefill


def test_missed_targets_name_the_floor_and_the_free_prefill_ceiling() -> None:
    s = _summary({"berth": [0.95, 0.85], "prefix-affinity": [0.97, 0.80], "free-prefill": [1.0, 0.88]})
    result = {"summary": s, "setup": {"loads": [1.0, 2.0], "configs": ["berth", "prefix-affinity",
              "free-prefill"], "workloads": ["chat"]}}  # fmt: skip
    goodput, ttft = prefix_report.verdicts(result)["chat"][:2]
    assert not goodput["passed"]
    assert goodput["free_prefill_value"] == pytest.approx(0.88)
    bound = {"goodput_bound": {"goodput": 1.0}, "ttft_p90_floor_ms": 200.0}
    # free prefill gets 0.88, +0.08 over the peer: below the 0.10 margin whatever the cache
    assert "out of reach for prefix awareness" in prefix_report._direction(goodput, bound)
    assert not ttft["passed"]  # 160 ms against 0.5 x 210 ms
    assert "move up to at least that" in prefix_report._direction(ttft, bound)
    assert "TTFT" not in prefix_report._direction(ttft, {"ttft_p90_floor_ms": 50.0})
