"""The fleet simulator carries out preemptions: the victim's engine request is aborted (the engine's
running count drops), the victim resumes with prompt + produced tokens and the rest of its output, its
client sees one stream with every token, and berth ends empty."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.types import EndpointId
from loadgen.bench.scheduling import classes
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim import SimOptions
from loadgen.fleetsim.sim import Simulation

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def fleet() -> tuple[EndpointSpec, ...]:
    """One interactive endpoint with one seat and one mixed endpoint with two (berth's cap and the
    engine's): interactive requests soon find their own endpoint full and preempt batch work."""
    common: dict[str, Any] = {"models": ("m",), "profile": "test-fast"}
    return (
        EndpointSpec(id="i0", instance_class="interactive", seed=0, cap=1, max_num_seqs=1, **common),
        EndpointSpec(id="m0", instance_class="mixed", seed=1, cap=2, max_num_seqs=2, **common),
    )


def run(tmp_path: Path) -> Simulation:
    gw = tmp_path / "gateway.toml"
    gw.write_text("[limits]\nmax_queue_per_model = 10000\nmax_queue_wait_s = 3600.0\n")
    sim = Simulation(
        SimOptions(
            policy=POLICIES / "chat-and-batch.toml",
            fleet=fleet(),
            gateway=gw,
            workload="chat-backlog:6",
            rate=4.0,
            duration_s=20.0,
            seed=2,
            request_timeout_s=3600.0,
            stall_timeout_s=3600.0,
            drain_timeout_s=3600.0,
        )
    )
    sim.run()
    return sim


def test_preempted_batch_work_resumes_and_every_token_arrives(tmp_path: Path) -> None:
    sim = run(tmp_path)
    data = sim._report([], 1.0).data  # the figures as the report has them
    stats = data["simulation"]
    assert stats["preemptions"] > 0
    assert stats["resumes"] > 0
    assert stats["recomputed_tokens"] > 0
    served = [r for r in sim.requests if r.status != 429]  # interactive ones admission refused
    assert all(r.cls == "interactive" for r in sim.requests if r not in served)
    assert any(r.cls == "batch" for r in served)
    for r in served:
        assert r.ok, r
        assert r.tokens == r.output_tokens  # one stream: nothing lost or doubled across the resume
    sched = sim.gw.scheduler
    for eid in ("i0", "m0"):
        assert sched.inflight_on(EndpointId(eid)) == 0
    assert sum(sched.queue_depths().values()) == 0
    assert all(ep.engine.num_running == 0 for ep in sim.endpoints)


def test_a_preemption_drops_the_engines_running_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int]] = []
    original = Simulation._preempted

    def spy(self: Simulation, d: Any) -> None:
        ep = self._by_id[d.endpoint.id]
        before = ep.engine.num_running + ep.engine.num_waiting
        original(self, d)
        seen.append((before, ep.engine.num_running + ep.engine.num_waiting))

    monkeypatch.setattr(Simulation, "_preempted", spy)
    run(tmp_path)
    assert seen
    assert all(after == before - 1 for before, after in seen)


def test_bench_quick_writes_its_report(tmp_path: Path) -> None:
    cfg = classes.Config(out=tmp_path, rates=(4.0,), seeds=1, backlog=40, duration_s=10.0, caps=(8, 128))
    result = classes.bench(cfg, log=lambda s: None)
    assert {r["config"] for r in result["runs"]} == set(classes.CONFIGS)
    assert {r["cap"] for r in result["sweep"]} == {8, 128}
    md = (tmp_path / "report.md").read_text()
    assert "| 4 | d-berth |" in md
    assert "| 4 | d-chiron-paper |" in md  # the paper's rule beside berth's
    assert "## Targets" in md
    try:
        import matplotlib  # noqa: F401  # the optional `plot` extra
    except ImportError:
        assert str(result["plot"]).startswith("no plot: matplotlib is not installed")
    else:
        assert result["plot"] == "timeline.png"
        assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(v["verdict"] in ("PASS", "FAIL", "N/A") for v in result["verdicts"])
    for r in result["runs"]:
        assert 0.0 <= r["interactive_attainment"] <= 1.0
        assert r["batch_finished"] == 40
