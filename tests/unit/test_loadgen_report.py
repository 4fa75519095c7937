"""The report: every request counted once, goodput, percentiles, schema, table, compare, CPU shares."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.client import RequestResult
from loadgen.cpu import CpuSampler, CpuShare, process_cpu_s
from loadgen.render import format_compare, format_report
from loadgen.report import SCHEMA_VERSION, TaskResult, build_report, load_report
from loadgen.workloads.base import Slo


def result(
    cls: str = "a",
    *,
    ok: bool = True,
    ttft: float = 0.1,
    e2e: float = 1.0,
    tokens: int = 10,
    slo: Slo | None = None,
    error: str | None = None,
) -> RequestResult:
    r = RequestResult(
        task_index=0,
        call_index=0,
        task_id=None,
        task_type=cls,
        cls=cls,
        model="m",
        api="chat",
        prompt_tokens=10,
        output_tokens=tokens,
        slo=slo or Slo(),
        sent_at_s=0.0,
        status=200 if ok else 500,
        ok=ok,
        error=None if ok else (error or "http_500"),
        ttft_s=ttft if ok else None,
        e2e_s=e2e if ok else None,
        tokens=tokens if ok else 0,
        gaps=array("d", [0.01] * (tokens - 1)) if ok else array("d"),
    )
    if ok and tokens > 1:
        r.atgt_s = (e2e - ttft) / (tokens - 1)
    r.slo_met = r.ok and r.slo.met(
        None if r.ttft_s is None else r.ttft_s * 1000, None if r.atgt_s is None else r.atgt_s * 1000,
        None if r.e2e_s is None else r.e2e_s * 1000,
    )  # fmt: skip
    return r


RUN = {"target": "t", "workload": "w", "rate": 1.0, "duration_s": 10.0}


def test_goodput_errors_and_percentiles() -> None:
    slo = Slo(ttft_ms=150)
    reqs = [result("a", ttft=t / 1000, slo=slo) for t in (50, 100, 200, 300)] + [result("b", ok=False)]
    rep = build_report(run=RUN, requests=reqs, tasks=[], wall_s=10.0)
    d = rep.data
    assert d["schema"] == SCHEMA_VERSION
    assert d["overall"]["count"] == 5
    assert d["overall"]["errors"] == 1
    assert d["overall"]["ok"] == 4
    assert d["overall"]["goodput"] == pytest.approx(2 / 5)
    a = d["classes"]["a"]
    assert a["goodput"] == 0.5
    assert a["ttft_p50_ms"] == pytest.approx(150.0)
    assert a["e2e_p99_ms"] == pytest.approx(1000.0)
    assert a["itl_p50_ms"] == pytest.approx(10.0)
    assert a["throughput_rps"] == pytest.approx(0.4)
    assert a["output_tokens_per_s"] == pytest.approx(4.0)
    b = d["classes"]["b"]
    assert b["count"] == 1
    assert b["goodput"] == 0.0
    assert b["ttft_p50_ms"] is None
    assert d["errors_by_kind"] == {"http_500": 1}
    for key in ("count", "goodput", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p95_ms",
                "e2e_p99_ms"):  # fmt: skip
        assert key in a
    assert orjson.loads(rep.to_json()) == d


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["x", "y", "z"]), st.booleans(), st.floats(0.001, 5.0), st.integers(1, 50)),
        max_size=60,
    )
)
def test_every_request_is_counted_exactly_once(rows: list[tuple[str, bool, float, int]]) -> None:
    reqs = [result(c, ok=ok, ttft=t / 10, e2e=t, tokens=n, slo=Slo(e2e_ms=2500)) for c, ok, t, n in rows]
    d = build_report(run=RUN, requests=reqs, tasks=[], wall_s=1.0).data
    assert d["overall"]["count"] == len(reqs)
    assert sum(c["count"] for c in d["classes"].values()) == len(reqs)
    assert sum(c["errors"] for c in d["classes"].values()) == d["overall"]["errors"]
    assert d["overall"]["ok"] + d["overall"]["errors"] == len(reqs)
    assert sum(d["errors_by_kind"].values()) == d["overall"]["errors"]
    if reqs:
        assert 0.0 <= d["overall"]["goodput"] <= 1.0


def test_task_stats() -> None:
    tasks = [
        TaskResult(0, "t0", "gen", 0.0, 2, 1000.0, "ttft", calls_sent=2, ok=True, latency_s=0.5, met=True),
        TaskResult(1, "t1", "gen", 1.0, 2, 1000.0, "ttft", calls_sent=2, ok=True, latency_s=1.5, met=False),
        TaskResult(2, "t2", "gen", 2.0, 2, 1000.0, "ttft", calls_sent=1, ok=False),
        TaskResult(3, None, "chat", 2.0, 1, None, "e2e", calls_sent=1, ok=True, latency_s=0.2, met=True),
    ]
    d = build_report(run=RUN, requests=[], tasks=tasks, wall_s=1.0).data
    gen = d["tasks"]["gen"]
    assert gen["count"] == 3
    assert gen["errors"] == 1
    assert gen["goodput"] == pytest.approx(1 / 3)
    assert gen["multi_step"]
    assert gen["calls"] == 2
    assert gen["sla_metric"] == "ttft"
    assert gen["sla_ms"] == 1000.0
    assert gen["latency_p50_ms"] == pytest.approx(1000.0)
    assert d["tasks"]["chat"]["sla_metric"] is None
    assert not d["tasks"]["chat"]["multi_step"]


def test_table_and_compare(tmp_path: Path) -> None:
    a = build_report(run=RUN, requests=[result("a", ttft=0.1), result("a", ok=False)], tasks=[], wall_s=1.0)
    b = build_report(run=RUN, requests=[result("a", ttft=0.2), result("c")], tasks=[], wall_s=1.0)
    table = format_report(a.data)
    assert "class" in table
    assert "(overall)" in table
    assert "errors: http_500=1" in table
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    a.write(pa)
    b.write(pb)
    text = format_compare([("a", load_report(pa)), ("b", load_report(pb))])
    rows = {tuple(line.split()[:2]): line.split() for line in text.splitlines()[1:]}
    assert rows[("a", "ttft_p50_ms")][-1] == "2.00x"
    assert rows[("c", "count")][2] == "-"
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"schema": 99}')
    with pytest.raises(ValueError, match="schema"):
        load_report(bad)


def test_cpu_share_of_this_process() -> None:
    own = process_cpu_s(os.getpid())
    assert own is not None
    assert own > 0
    assert process_cpu_s(2**22 + 12345) is None
    sampler = CpuSampler({"me": os.getpid(), "gone": 2**22 + 12345})
    sampler.start()
    sum(i * i for i in range(200_000))  # burn a little CPU
    shares = {s.name: s for s in sampler.stop()}
    assert shares["me"].cpu_s is not None
    assert shares["me"].share is not None
    assert shares["gone"].share is None
    assert not shares["gone"].flagged
    assert CpuShare("berth", 1, cpu_s=9.0, wall_s=10.0).flagged
    assert not CpuShare("berth", 1, cpu_s=7.0, wall_s=10.0).flagged


def test_cpu_flags_appear_in_the_report() -> None:
    d = build_report(
        run=RUN, requests=[], tasks=[], wall_s=1.0, cpu=[CpuShare("berth", 42, cpu_s=0.95, wall_s=1.0)]
    ).data
    assert d["cpu"]["flagged"] == ["berth"]
    assert d["cpu"]["processes"]["berth"]["cpu_share"] == 0.95
    assert "WARNING: berth" in format_report(d)


def test_the_table_and_the_cpu_line_say_their_units() -> None:
    cpu = [CpuShare("berth", 42, cpu_s=0.5, wall_s=2.0), CpuShare("gone", 7, cpu_s=None, wall_s=2.0)]
    d = build_report(run=RUN, requests=[result("a", ttft=0.1)], tasks=[], wall_s=2.0, cpu=cpu).data
    lines = format_report(d).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("class"))
    assert lines[header].split() == ["class", "n", "err", "goodput", "ttft50", "ttft95", "ttft99", "e2e50",
                                     "e2e95", "e2e99", "itl50", "rate", "output"]  # fmt: skip
    assert lines[header + 1].split() == ["req", "req", "0-1", *["ms"] * 7, "req/s", "tok/s"]
    cpu_line = next(line for line in lines if line.startswith("cpu time"))
    assert cpu_line == (
        f"cpu time over the {d['run']['wall_s']:.1f} s run (100 % = one core busy throughout): "
        "berth (pid 42) 0.5 s = 25 %, gone (pid 7) -"
    )
