"""The offline fleet simulator: deterministic, every request accounted for, berth's own state back to
zero at the end, the client's timers and berth's refusals as a live client would see them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.core.types import EndpointId
from loadgen.cli import main as loadgen_main
from loadgen.engine_sim.fleet import FleetFileError, parse_fleet
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions, simulate
from loadgen.fleetsim.sim import Simulation
from loadgen.report import GapHistogram

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def fleet(n: int = 4, **kw: Any) -> tuple[EndpointSpec, ...]:
    return tuple(EndpointSpec(models=("m",), profile="test-fast", seed=i, id=f"e{i}", **kw) for i in range(n))


def opts(**kw: Any) -> SimOptions:
    base: dict[str, Any] = {
        "policy": POLICIES / "default.toml",
        "fleet": fleet(),
        "workload": "sharegpt-like",
        "rate": 4.0,
        "duration_s": 20.0,
        "seed": 3,
    }
    return SimOptions(**{**base, **kw})


def without_wall(data: dict[str, Any]) -> dict[str, Any]:
    out = dict(data)
    out["simulation"] = {
        k: v for k, v in data["simulation"].items() if k not in ("wall_s", "events_per_s", "requests_per_s")
    }
    return out


def test_the_same_seed_gives_the_same_report() -> None:
    a = simulate(opts(policy=POLICIES / "coding-assistant.toml", workload="coding:pattern1", rate=2.0))
    b = simulate(opts(policy=POLICIES / "coding-assistant.toml", workload="coding:pattern1", rate=2.0))
    assert orjson.dumps(without_wall(a.data)) == orjson.dumps(without_wall(b.data))
    c = simulate(
        opts(policy=POLICIES / "coding-assistant.toml", workload="coding:pattern1", rate=2.0, seed=4)
    )
    assert orjson.dumps(without_wall(c.data)) != orjson.dumps(without_wall(a.data))


def test_every_request_is_served_and_berth_ends_empty() -> None:
    sim = Simulation(opts())
    report = sim.run()
    data = report.data
    overall = data["overall"]
    assert overall["count"] == len(report.requests) > 40
    assert overall["ok"] == overall["count"]
    assert sum(c["count"] for c in data["classes"].values()) == overall["count"]
    assert all(r.tokens == r.output_tokens for r in report.requests)
    assert all(r.endpoint in {"e0", "e1", "e2", "e3"} for r in report.requests)
    sched = sim.gw.scheduler
    assert sum(sched.queue_depths().values()) == 0
    assert all(sched.inflight_on(EndpointId(e)) == 0 for e in ("e0", "e1", "e2", "e3"))
    assert all(ep.engine.num_running == 0 and ep.engine.num_waiting == 0 for ep in sim.endpoints)
    assert data["simulation"]["policy_faults"] == 0
    assert data["simulation"]["left_out"]
    util = data["fleet"]["utilization"]
    assert util is not None
    assert 0.0 < util <= 1.0
    assert overall["itl_p50_ms"] is not None
    assert overall["ttft_p50_ms"] is not None


def test_telemetry_learns_from_the_simulated_traffic() -> None:
    sim = Simulation(opts(duration_s=40.0))
    sim.run()
    tel = sim.gw.telemetry
    tel.refresh(refit=True)
    ep = tel.fleet.endpoints[EndpointId("e0")]
    assert ep.timings.ttft.n > 0
    assert tel.tokens.observations("m") > 0
    view = sim.gw.scheduler.endpoint_view(EndpointId("e0"))
    assert view is not None
    assert view.ttft_ewma_s is not None


def test_a_client_that_times_out_frees_its_seat() -> None:
    one = (EndpointSpec(models=("m",), profile="test-fast", id="only", cap=1, max_num_seqs=1),)
    sim = Simulation(opts(fleet=one, rate=6.0, duration_s=10.0, stall_timeout_s=0.5, drain_timeout_s=5.0))
    report = sim.run()
    errors = report.data["errors_by_kind"]
    assert errors.get("timeout", 0) > 0
    assert report.data["overall"]["ok"] > 0
    sched = sim.gw.scheduler
    assert sched.inflight_on(EndpointId("only")) == 0
    assert sum(sched.queue_depths().values()) == 0
    assert sim.endpoints[0].engine.num_running == 0


def test_refusals_reach_the_client_with_their_code() -> None:
    report = simulate(opts(models=("not-served",)))
    assert report.data["overall"]["ok"] == 0
    assert report.data["rejections_by_reason"] == {"model_not_found": report.data["overall"]["count"]}
    assert set(report.data["errors_by_kind"]) == {"http_404"}


def test_a_full_queue_is_refused_with_429(tmp_path: Path) -> None:
    gw = tmp_path / "gateway.toml"
    gw.write_text("[limits]\nmax_queue_per_model = 1\n")
    one = (EndpointSpec(models=("m",), profile="test-fast", id="only", cap=1),)
    report = simulate(opts(fleet=one, gateway=gw, rate=20.0, duration_s=5.0))
    assert report.data["rejections_by_reason"].get("queue_full", 0) > 0
    assert report.data["overall"]["ok"] > 0


def test_the_gap_histogram_is_within_one_percent() -> None:
    rng = np.random.default_rng(1)
    gaps = rng.lognormal(mean=-3.5, sigma=0.7, size=20_000)
    h = GapHistogram()
    h.add_many(gaps.tolist())
    for q in (50, 99):
        exact = float(np.percentile(gaps, q)) * 1000.0
        got = h.quantile_ms(q)
        assert got is not None
        assert math.isclose(got, exact, rel_tol=0.012)
    assert GapHistogram().quantile_ms(50) is None


def test_fleet_files_take_the_gateway_side_keys() -> None:
    doc = {
        "defaults": {"profile": "test-fast", "cap": 4},
        "endpoints": [
            {"id": "i", "models": ["m"], "class": "interactive", "count": 2, "node": "gpu-1"},
            {"models": ["m"], "class": "batch", "cap": 8},
        ],
    }
    specs = parse_fleet(doc)
    assert [(s.id, s.instance_class, s.cap, s.node) for s in specs] == [
        ("i-0", "interactive", 4, "gpu-1"),
        ("i-1", "interactive", 4, "gpu-1"),
        (None, "batch", 8, None),
    ]
    with pytest.raises(FleetFileError, match=r"endpoints\[0\].*class must be"):
        parse_fleet({"endpoints": [{"models": ["m"], "class": "fast"}]})


def test_the_cli_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[defaults]\nprofile = "test-fast"\n[[endpoints]]\nmodels = ["m"]\ncount = 2\n')
    out = tmp_path / "report.json"
    rc = loadgen_main(
        [
            "sim",
            "--fleet",
            str(path),
            "--rate",
            "2",
            "--duration",
            "5",
            "--seed",
            "1",
            "--out",
            str(out),
            "-q",
        ]
    )
    assert rc == 0
    data = orjson.loads(out.read_bytes())
    assert data["run"]["target"] == "fleetsim"
    assert data["overall"]["count"] > 0
    rc = loadgen_main(["sim", "--fleet", str(tmp_path / "missing.toml"), "-q"])
    assert rc == 2
    assert "missing.toml" in capsys.readouterr().err
