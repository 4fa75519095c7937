"""The classes benchmark's live run builds the simulated run's setting, scaled: the same fleet (sped up),
endpoint classes and caps on berth's side, the simulator's schedule with its times divided by the speed,
berth's times divided by it, and its figures scaled back; and it judges whether live confirms."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.config import load_gateway_config
from loadgen.bench.scheduling import classes, classes_live, classes_live_setup
from loadgen.bench.scheduling.classes_live import build_parser, config_from_args, scaled_back
from loadgen.bench.scheduling.classes_live_report import agreement, targets, verdict
from loadgen.bench.scheduling.classes_live_setup import (
    LiveConfig,
    live_fleet_file,
    live_gateway_toml,
    live_policy_text,
    schedule,
)
from loadgen.client import RequestResult
from loadgen.engine_sim.fleet import parse_fleet
from loadgen.report import Report
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload
from loadgen.workloads.base import Slo


def test_the_live_fleet_is_the_simulated_one_sped_up() -> None:
    sim = parse_fleet(tomllib.loads(classes.fleet_file(classes.ENGINE_SEATS)))
    live = parse_fleet(tomllib.loads(live_fleet_file(4.0)))
    assert [s.speed for s in live] == [4.0] * len(sim)
    assert [(s.instance_class, s.cap, s.max_num_seqs, s.scheduling_policy) for s in live] == [
        (s.instance_class, s.cap, s.max_num_seqs, s.scheduling_policy) for s in sim
    ]


def test_berths_configuration_carries_classes_caps_and_scaled_times(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(live_policy_text(classes.BERTH, 2.0))
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(8)]
    path = tmp_path / "gateway.toml"
    path.write_text(live_gateway_toml(urls, port=8080, policy=policy, speed=2.0))
    cfg = load_gateway_config(path)
    got = [(e.id, e.url, e.instance_class, e.cap, e.scheduling) for e in cfg.endpoints]
    classes_in_order = ["interactive"] * 2 + ["mixed"] * 4 + ["batch"] * 2
    assert [(g[0], g[1], str(g[2]), g[3], str(g[4])) for g in got] == [
        (f"e{i:03d}", urls[i], classes_in_order[i], classes.ENGINE_SEATS, "priority") for i in range(8)
    ]
    assert cfg.scrape.interval_s == 1.0
    assert cfg.limits.max_queue_wait_s == 3600.0
    assert cfg.telemetry.refresh_interval_s == 0.5
    assert cfg.upstream.pool_total >= 8 * classes.ENGINE_SEATS
    with pytest.raises(ValueError, match="URLs for a fleet of 8"):
        live_gateway_toml(urls[:3], port=8080, policy=policy, speed=2.0)


def test_chirons_interval_is_scaled_and_the_rest_of_the_policy_kept() -> None:
    assert "interval_s = 0.5" in live_policy_text(classes.BERTH, 4.0)
    assert live_policy_text(classes.BERTH, 1.0).replace("interval_s = 2", "interval_s = 2.0") == (
        classes.policy_text(classes.BERTH)
    )
    assert live_policy_text(classes.BASELINE, 4.0) == classes.policy_text(classes.BASELINE)


def test_the_schedule_is_the_simulators_with_times_divided_by_the_speed() -> None:
    cfg = LiveConfig(out=Path("unused"), rate=2.0, backlog=5, duration_s=20.0, speed=4.0, seed=3)
    opts = RunOptions(target="sim", workload="chat-backlog:5", rate=2.0, duration_s=20.0, seed=3)
    sim = build_schedule(get_workload(opts.workload), opts)
    live = schedule(cfg)
    assert len(live) == len(sim) > 5
    for a, b in zip(sim, live, strict=True):
        assert b.at_s == pytest.approx(a.at_s / 4.0)
        assert (b.index, b.calls) == (a.index, a.calls)


def test_live_figures_are_scaled_back_to_simulated_seconds() -> None:
    r = RequestResult(
        task_index=0,
        call_index=0,
        task_id=None,
        task_type="batch",
        cls="batch",
        model="chat-7b",
        api="chat",
        prompt_tokens=10,
        output_tokens=100,
        slo=Slo(ttft_ms=1_800_000.0, atgt_ms=1000.0),
        sent_at_s=1.0,
        ok=True,
        ttft_s=0.5,
        e2e_s=10.0,
        atgt_s=0.05,
        tokens=100,
        slo_met=True,
    )
    back = scaled_back(Report(data={}, requests=[r]), 2.0, {"t_s": [0.0]})
    (s,) = back.requests
    assert (s.sent_at_s, s.ttft_s, s.e2e_s, s.atgt_s) == (2.0, 1.0, 20.0, 0.1)
    assert s.slo == Slo(ttft_ms=3_600_000.0, atgt_ms=2000.0)
    assert back.data["fleet"]["timeline"] == {"t_s": [0.0]}


def _fig(att: float, tps: float, done: float | None, itl: float = 1.0) -> dict[str, Any]:
    return {"interactive_attainment": att, "itl_kept": itl, "batch_tokens_per_s": tps, "backlog_done_s": done}


def _result(
    sim: dict[str, dict[str, Any]], live: dict[str, dict[str, Any]], valid: bool = True
) -> dict[str, Any]:
    return {
        "live": [{"config": c, "valid": valid} for c in live],
        "targets": {"sim": targets(sim), "live": targets(live)},
        "agreement": {c: agreement(sim[c], live[c]) for c in sim},
    }


A, D = classes.BASELINE, classes.BERTH


def test_live_confirms_when_figures_and_verdicts_agree() -> None:
    sim = {A: _fig(0.36, 3289.0, 276.0), D: _fig(1.0, 2551.0, 356.0)}
    live = {A: _fig(0.34, 3150.0, 290.0), D: _fig(1.0, 2500.0, 362.0)}
    assert verdict(_result(sim, live)) == ("CONFIRMS", [])


def test_live_differs_on_a_figure_out_of_tolerance_or_a_verdict() -> None:
    sim = {A: _fig(0.36, 3289.0, 276.0), D: _fig(1.0, 2551.0, 356.0)}
    live = {A: _fig(0.36, 2500.0, 360.0), D: _fig(0.98, 2500.0, 362.0)}
    v, why = verdict(_result(sim, live))
    assert v == "DIFFERS"
    assert any("batch_tokens_per_s" in w and A in w for w in why)
    assert any("d_attainment_pass" in w for w in why)
    assert not any(D in w and "batch_tokens_per_s" in w for w in why)


def test_a_cpu_starved_live_run_is_not_judged() -> None:
    sim = {A: _fig(0.36, 3289.0, 276.0), D: _fig(1.0, 2551.0, 356.0)}
    v, why = verdict(_result(sim, sim, valid=False))
    assert v == "NOT JUDGED"
    assert "CPU-starved" in why[0]
    assert "otherwise the figures agree" in why[1]


def test_the_options() -> None:
    p = build_parser()
    cfg = config_from_args(p.parse_args(["--live", "--out", "x", "--speed", "3", "--rates", "0.5"]))
    assert (cfg.speed, cfg.rate, cfg.seed, cfg.backlog) == (3.0, 0.5, 0, classes_live_setup.DEFAULT_BACKLOG)
    quick = config_from_args(p.parse_args(["--live", "--quick", "--out", "x"]))
    assert quick.backlog == classes_live_setup.QUICK["backlog"]
    for bad, why in (
        (["--rates", "0.25,3"], "one rate"),
        (["--seeds", "2"], "one seed"),
        (["--speed", "0"], "speed > 0"),
    ):
        with pytest.raises(ValueError, match=why):
            config_from_args(p.parse_args(["--live", "--out", "x", *bad]))
    assert classes_live.main(["--out", "x", "--speed", "2"]) == 2  # --speed without --live
