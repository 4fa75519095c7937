"""berth-loadgen against simulated endpoints over loopback HTTP (and once through berth): counting, model
mapping, errors, stalls, drain, record/replay, the endpoint and queue time berth reports, and the command
line. Assertions never depend on how fast things ran."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from loadgen.cli import main as loadgen_main
from loadgen.client import RequestResult
from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.harness import start_engine_sim
from loadgen.runner import LiveSnapshot, RunOptions, run_workload
from loadgen.workloads.base import CallSpec, TaskSpec
from tests.integration.conftest import EngineServer, StartGateway
from tests.integration.fake_engine import FakeEngine


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    spec = EndpointSpec(models=("first", "second"), profile="test-fast", speed=10.0, load_time_s=0.0)
    async with SimFleet([spec]) as f:
        yield f


def opts(url: str, **kw: object) -> RunOptions:
    base: dict[str, object] = {"target": url + "/v1", "rate": 10.0, "duration_s": 1.0, "seed": 3}
    base.update(kw)
    return RunOptions(**base)  # type: ignore[arg-type]


async def test_coding_run_counts_every_request_once_and_maps_models(fleet: SimFleet) -> None:
    seen: list[RequestResult] = []
    ticks: list[LiveSnapshot] = []
    report = await run_workload(
        opts(fleet.urls[0], workload="coding:pattern2"),
        on_result=seen.append,
        on_tick=ticks.append,
        tick_s=0.2,
    )
    d = report.data
    assert d["schema"] == 1
    assert d["run"]["models"] == ["first", "second"]
    n = len(report.requests)
    assert n == len(seen) == d["overall"]["count"] == sum(c["count"] for c in d["classes"].values())
    assert d["overall"]["errors"] == 0
    assert d["errors_by_kind"] == {}
    assert sum(t["count"] for t in d["tasks"].values()) == d["run"]["tasks_scheduled"] == len(report.tasks)
    assert n == sum(t.n_calls for t in report.tasks)
    for r in report.requests:
        assert r.ok
        assert r.tokens == r.output_tokens
        assert r.finish_reason == "length"
        assert r.model == ("first", "second")[r.call_index]
        assert r.ttft_s is not None
        assert r.e2e_s is not None
        assert r.ttft_s <= r.e2e_s
        assert len(r.gaps) == r.tokens - 1
    assert 0.0 <= d["overall"]["goodput"] <= 1.0
    assert ticks
    assert ticks[-1].requests_done == n
    assert ticks[-1].in_flight == 0
    state = fleet.endpoint(0).state()
    assert state["stats"]["generation_tokens"] == sum(r.tokens for r in report.requests)


async def test_models_option_overrides_the_listing(fleet: SimFleet) -> None:
    report = await run_workload(opts(fleet.urls[0], workload="coding:pattern2", models=("second",)))
    assert {r.model for r in report.requests} == {"second"}


async def test_failures_are_errors_and_end_their_task(fleet: SimFleet) -> None:
    fleet.endpoint(0).set_faults(fail_fraction=1.0)
    report = await run_workload(opts(fleet.urls[0], workload="coding:pattern2"))
    d = report.data
    assert d["overall"]["errors"] == d["overall"]["count"] == len(report.tasks)  # second calls never sent
    assert d["errors_by_kind"] == {"http_500": len(report.tasks)}
    assert d["overall"]["goodput"] == 0.0
    assert all(t["goodput"] == 0.0 for t in d["tasks"].values())


async def test_stalled_streams_time_out(fleet: SimFleet) -> None:
    ep = fleet.endpoint(0)
    ep.set_faults(stall_after_tokens=1)
    report = await run_workload(opts(fleet.urls[0], workload="sharegpt-like", stall_timeout_s=0.2))
    assert report.data["errors_by_kind"] == {"timeout": report.data["overall"]["count"]}
    assert all(r.ttft_s is not None for r in report.requests)  # the first token did arrive
    await ep.wait_idle()  # the client's disconnects freed the simulator


async def test_drain_timeout_cancels_and_counts_unfinished(fleet: SimFleet) -> None:
    ep = fleet.endpoint(0)
    ep.set_faults(stall_after_tokens=0)
    report = await run_workload(
        opts(
            fleet.urls[0], workload="sharegpt-like", duration_s=0.5, stall_timeout_s=60.0, drain_timeout_s=0.1
        )
    )
    d = report.data
    assert d["overall"]["count"] > 0
    assert d["errors_by_kind"] == {"unfinished": d["overall"]["count"]}
    await ep.wait_idle()  # cancelling the client's requests closed their connections
    assert ep.live_requests == 0
    assert ep.engine.num_running == 0


async def test_record_then_replay(fleet: SimFleet, tmp_path: Path) -> None:
    rec = tmp_path / "sent.jsonl"
    first = await run_workload(opts(fleet.urls[0], workload="coding:ttft-heavy", record=rec))
    lines = [orjson.loads(line) for line in rec.read_bytes().splitlines()]
    assert len(lines) == len(first.requests)
    assert all(line["observed"]["ok"] for line in lines)
    replay = await run_workload(opts(fleet.urls[0], workload=str(rec), duration_s=0.0))
    key = lambda r: (r.task_type, r.call_index, r.model, r.prompt_tokens, r.output_tokens)  # noqa: E731
    assert sorted(map(key, replay.requests)) == sorted(map(key, first.requests))
    assert {t.task_id for t in replay.tasks} == {t.task_id for t in first.tasks}


async def test_explicit_schedule_and_headers(fleet: SimFleet) -> None:
    tasks = [TaskSpec(0, 0.0, "probe", (CallSpec(20, 3, api="completion", cls="probe"),))]
    report = await run_workload(opts(fleet.urls[0]), schedule=tasks)
    (r,) = report.requests
    assert r.ok
    assert r.tokens == 3
    assert r.api == "completion"
    assert report.data["classes"]["probe"]["count"] == 1


@pytest.fixture
def sim_process(tmp_path: Path) -> Iterator[str]:
    args = ["--port", "0", "--profile", "test-fast", "--speed", "10", "--load-time-s", "0", "--model", "a,b"]
    proc, (url,) = start_engine_sim(args, tmp_path / "sim.log")
    with proc:
        yield url


def test_command_line_run_and_compare(
    sim_process: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_a, out_b, plot = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "p.png"
    common = ["run", "--target", sim_process, "--rate", "8", "--duration", "0.5", "--slo-scale", "0.1"]
    assert loadgen_main([*common, "--workload", "sharegpt-like", "--out", str(out_a), "--seed", "1"]) == 0
    table = capsys.readouterr().out
    assert "(overall)" in table
    assert "(100 % = one core busy throughout): loadgen" in table
    assert "\r[" not in table
    rc = loadgen_main([*common, "--workload", "chat-batch", "--out", str(out_b), "-q", "--plot", str(plot)])
    assert rc == 0
    err = capsys.readouterr().err
    data = orjson.loads(out_b.read_bytes())
    assert data["schema"] == 1
    assert set(data["classes"]) <= {"interactive", "batch"}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib" in err
        assert not plot.exists()
    else:  # pragma: no cover - matplotlib is optional
        assert plot.exists()
    assert loadgen_main(["compare", str(out_a), str(out_b)]) == 0
    text = capsys.readouterr().out
    assert "(overall)" in text
    assert "/a" in text
    assert loadgen_main(["run", "--target", sim_process, "--workload", "nope"]) == 2


async def test_through_berth_each_request_records_its_endpoint_and_queue_time(
    engine_server: EngineServer, start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = await start_gateway([await engine_server(FakeEngine()) + ",engine=vllm"])
    rec = tmp_path / "sent.jsonl"
    tasks = [TaskSpec(0, 0.0, "probe", (CallSpec(20, 3, cls="probe"),))]
    report = await run_workload(opts(gw.url, models=["tiny"], record=rec), schedule=tasks)
    (r,) = report.requests
    assert r.ok
    assert r.endpoint in {str(e) for e in gw.gw.scheduler.endpoint_ids()}
    assert r.queue_ms is not None
    assert r.queue_ms >= 0.0
    (line,) = [orjson.loads(x) for x in rec.read_bytes().splitlines()]
    assert (line["observed"]["endpoint"], line["observed"]["queue_ms"]) == (r.endpoint, r.queue_ms)


async def test_an_engine_without_berth_records_no_endpoint(fleet: SimFleet) -> None:
    tasks = [TaskSpec(0, 0.0, "probe", (CallSpec(20, 3, cls="probe"),))]
    (r,) = (await run_workload(opts(fleet.urls[0]), schedule=tasks)).requests
    assert r.ok
    assert (r.endpoint, r.queue_ms) == (None, None)
