"""The fleet simulator with the policy's autoscaler: instances started and retired by the lifecycle core
on the virtual clock, each its own engine, device time accounted; and the autoscaling benchmark's quick
run end to end."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from gateway.core.types import InstanceClass, ModelName
from gateway.lifecycle.instances import DeviceSpec, LifecycleSettings, ModelSpec, NodeSpec
from loadgen.bench.lifecycle import autoscaling, autoscaling_cato, autoscaling_chiron, maaso, maaso_setup
from loadgen.bench.lifecycle.autoscaling_common import Burst, bursty_arrivals
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.lifecycle import InitialInstances, LifecycleOptions
from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.sim import simulate
from loadgen.report import Report
from loadgen.workloads import get_workload

GIB = 1 << 30
M = ModelName("m")
POLICY = """[ordering]
plugin = "fcfs"
[placement]
picker = { plugin = "max-score" }
[[placement.scorers]]
plugin = "least-outstanding"
"""


def _sim(tmp_path: Path, autoscale: str | None, *, seed: int = 0, initial: int = 1) -> Report:
    policy = tmp_path / "p.toml"
    policy.write_text(POLICY + ("" if autoscale is None else "[autoscale]\n" + autoscale))
    tasks = get_workload("sharegpt-like").schedule(
        4.0, 60.0, bursty_arrivals(random.Random(seed), [Burst(20.0, 15.0, 4.0)]), random.Random(seed + 1)
    )
    return simulate(
        SimOptions(
            policy=policy,
            fleet=(EndpointSpec(models=(M,), id=M, profile="test-fast", max_num_seqs=4, cap=4),),
            workload="sharegpt-like+burst",
            duration_s=60.0,
            seed=seed,
            models=(M,),
            schedule=tuple(tasks),
            lifecycle=LifecycleOptions(
                models=(ModelSpec(M, 4 * GIB, 1, 2.0),),
                nodes=(NodeSpec("n1", tuple(DeviceSpec(f"gpu{i}", 8 * GIB) for i in range(6))),),
                evictor="lru",
                settings=LifecycleSettings(churn_guard_s=5.0, drain_timeout_s=30.0, load_deadline_s=60.0),
                stop_s=0.5,
                initial=(InitialInstances(M, initial, InstanceClass.MIXED),),
            ),
        )
    )


def test_a_static_fleet_is_charged_its_devices_for_the_whole_run(tmp_path: Path) -> None:
    rep = _sim(tmp_path, None, initial=2)
    lc = rep.data["lifecycle"]
    end = max(r.sent_at_s + (r.e2e_s or 0.0) for r in rep.requests)
    assert lc["device_hours"] == pytest.approx(2 * end / 3600.0, abs=1e-4)
    assert (lc["loads"], lc["peak_devices"], lc["autoscale"]) == (2, 2, None)


def test_a_burst_scales_out_and_the_quiet_after_it_scales_back_in(tmp_path: Path) -> None:
    rep = _sim(
        tmp_path,
        'plugin = "queue-length"\nparams = { target_per_instance = 2.0, upscale_delay_s = 0.0, '
        "downscale_delay_s = 5.0 }\ninterval_s = 1\nscale_in_cooldown_s = 5\nmin_instances = 1\n"
        "max_instances = 6\n",
    )
    lc = rep.data["lifecycle"]
    assert lc["autoscale"]["started"] > 0
    assert lc["stops"].get("scaled_in", 0) > 0
    assert lc["peak_devices"] > 1
    assert lc["lost_requests"] == 0  # a scale-in drains: nothing running is lost
    assert rep.overall["errors"] == 0
    devices = rep.data["fleet"]["timeline"]["devices"]
    assert max(devices) > devices[0]
    kinds = {(d["kind"], d["outcome"]) for d in lc["decisions"]}
    assert ("scale_out", "acted") in kinds or ("scale_out", "clipped") in kinds
    hyst = lc["autoscale"]["hysteresis"]
    assert hyst == pytest.approx(lc["autoscale"]["actions"] / lc["autoscale"]["started"], abs=1e-4)


def test_dry_run_records_decisions_and_starts_nothing(tmp_path: Path) -> None:
    rep = _sim(
        tmp_path,
        'plugin = "queue-length"\nparams = { upscale_delay_s = 0.0 }\ninterval_s = 1\ndry_run = true\n',
    )
    lc = rep.data["lifecycle"]
    assert lc["loads"] == 1
    assert lc["decisions"]
    assert {d["outcome"] for d in lc["decisions"]} <= {"dry_run", "refused"}


def test_same_seed_same_scaling(tmp_path: Path) -> None:
    scale = 'plugin = "chiron"\ninterval_s = 1\nscale_in_cooldown_s = 5\nmin_instances = 1\n'
    a = _sim(tmp_path, scale, seed=3).data["lifecycle"]
    b = _sim(tmp_path, scale, seed=3).data["lifecycle"]
    assert a == b


def test_the_benchmark_quick_run_writes_every_settings_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --quick with the settings shrunk further, so the test stays fast; the plumbing is the command's own
    monkeypatch.setattr(
        autoscaling_chiron,
        "QUICK",
        autoscaling_chiron.ChironSetting(
            duration_s=40.0, rate=1.0, bursts=(Burst(10.0, 10.0, 3.0),), backlog=40, batch_ttft_s=60.0
        ),
    )
    monkeypatch.setattr(
        autoscaling_cato, "QUICK", autoscaling_cato.CatoSetting(duration_s=40.0, rate=1.0, bursts=())
    )
    # (maaso's setting runs in the next test: its simulation is its own module's)
    code = autoscaling.main(["--quick", "--seeds", "0", "--settings", "chiron,cato", "--out", str(tmp_path)])
    assert code == 0  # it ran to the end; the targets are judged on the full run, here only that they are
    doc = orjson.loads((tmp_path / "report.json").read_bytes())
    assert [s["name"] for s in doc["settings"]] == ["chiron", "cato"]
    chiron = doc["settings"][0]
    assert [r["config"] for r in chiron["rows"]] == [
        "chiron",
        "utilization-band",
        "aladdin-workers",
        "static",
    ]
    assert all(t["pass"] in (True, False) for t in chiron["targets"])
    assert chiron["rows"][0]["device_hours"]["mean"] > 0
    cato = doc["settings"][1]
    assert [r["config"] for r in cato["rows"]] == [
        "cato-sla",
        "cato-sla-finished",
        "queue-length",
        "queue-length-target1",
        "aladdin-workers",
        "cato-sla+slack-routing",
        "cato-sla-idle10s",
        "cato-sla-idle60s",
    ]
    assert cato["rows"][0]["device_utilization"]["mean"] > 0
    md = (tmp_path / "report.md").read_text()
    assert "## Chiron's setting" in md
    assert "## CATO's setting" in md
    assert ("PASS" in md) or ("FAIL" in md)
    assert code == 0  # whatever the verdict (doc["pass"]): it ran to the end
    assert doc["pass"] in (True, False)


def test_maasos_setting_joins_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maaso, "QUICK_DURATION_S", 10.0)
    result = autoscaling.run_maaso([0], True, lambda _: None, work=tmp_path)
    assert result.name == "maaso"
    assert {r["config"] for r in result.rows} == set(maaso_setup.CONFIGS)
    assert result.targets
    judged = [t for t in result.targets if not t.name.startswith("(shown)")]
    assert judged
    assert all(t.target.startswith("≥") for t in judged)
    assert all(t.target == "-" and t.passed for t in result.targets if t.name.startswith("(shown)"))
    assert "maaso" in result.markdown.lower()


def test_the_benchmark_refuses_an_unknown_setting(tmp_path: Path) -> None:
    assert autoscaling.main(["--settings", "nope", "--out", str(tmp_path)]) == 2
