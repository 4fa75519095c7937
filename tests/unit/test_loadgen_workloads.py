"""Workloads, arrival processes, prompts and trace files (pure functions, seeded)."""

from __future__ import annotations

import itertools
import random
import statistics
from collections import Counter
from pathlib import Path

import orjson
import pytest

from loadgen.client import build_body, build_headers
from loadgen.prompts import CHAT_TEMPLATE_TOKENS, prompt_text
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import BUILTIN_NAMES, VARIANTS, get_workload
from loadgen.workloads.arrivals import arrival_times
from loadgen.workloads.base import CallSpec, Slo, TaskSpec, allot
from loadgen.workloads.coding import MIXES
from loadgen.workloads.trace import TraceError, load_trace, trace_line

ALL_SPECS = [f"{n}:{v}" for n in BUILTIN_NAMES for v in VARIANTS[n]] + ["sharegpt-like", "chat"]


def schedule(spec: str, *, rate: float = 20.0, duration: float = 50.0, seed: int = 1) -> list[TaskSpec]:
    return build_schedule(
        get_workload(spec), RunOptions(target="x", workload=spec, rate=rate, duration_s=duration, seed=seed)
    )


@pytest.mark.parametrize("spec", ALL_SPECS, ids=ALL_SPECS)
def test_schedules_are_deterministic_and_sorted(spec: str) -> None:
    a, b = schedule(spec), schedule(spec)
    assert a == b
    assert a != schedule(spec, seed=2)
    assert [t.at_s for t in a] == sorted(t.at_s for t in a)
    assert all(0 <= t.at_s < 50.0 for t in a)
    for t in a:
        assert t.calls
        assert all(c.prompt_tokens >= 1 and c.output_tokens >= 1 for c in t.calls)
        if t.multi_step or t.task_sla_ms is not None:
            assert t.task_id is not None


@pytest.mark.parametrize("mix", sorted(MIXES), ids=sorted(MIXES))
def test_coding_mixes_follow_their_shares(mix: str) -> None:
    tasks = schedule(f"coding:{mix}", rate=200.0, duration=20.0)
    counts = Counter(t.task_type for t in tasks)
    for kind, share in MIXES[mix].items():
        assert counts[kind] / len(tasks) == pytest.approx(share, abs=0.03), kind


def test_coding_task_shapes() -> None:
    by_type: dict[str, list[TaskSpec]] = {}
    for t in schedule("coding:pattern2", rate=100.0, duration=10.0):
        by_type.setdefault(t.task_type, []).append(t)
    for t in by_type["completion"]:
        (c,) = t.calls
        assert c.output_tokens < 10
        assert t.sla_metric == "ttft"
        assert c.model_slot == 0
    for t in by_type["summarization"]:
        (c,) = t.calls
        assert c.prompt_tokens >= 1500
        assert 20 <= c.output_tokens <= 30
        assert t.sla_metric == "e2e"
    for kind in ("generation", "translation"):
        for t in by_type[kind]:
            first, second = t.calls
            assert (first.model_slot, second.model_slot) == (0, 1)
            assert second.prompt_tokens >= first.prompt_tokens + first.output_tokens
            budgets = [v for c in t.calls for v in (c.slo.ttft_ms, c.slo.e2e_ms) if v is not None]
            assert sum(budgets) == pytest.approx(t.task_sla_ms)  # CATO allotment splits the task SLA
    assert by_type["translation"][0].calls[0].output_tokens >= 100


def test_multi_model_slots_and_skew() -> None:
    tasks = schedule("multi-model:popularity-skewed", rate=200.0, duration=20.0)
    kinds = Counter(t.task_type for t in tasks)
    assert kinds["completion"] / len(tasks) == pytest.approx(0.7, abs=0.03)
    slots = Counter(t.calls[0].model_slot % 8 for t in tasks)  # language index
    assert slots[1] / len(tasks) == pytest.approx(0.2, abs=0.03)  # java
    assert slots[4] / len(tasks) == pytest.approx(0.05, abs=0.02)  # go
    for t in tasks:
        slot = t.calls[0].model_slot
        assert (slot < 8) == (t.task_type == "completion")
        assert (t.calls[0].slo_class == "interactive") == (t.task_type == "completion")


def test_chat_batch_classes_and_queue() -> None:
    mixed = schedule("chat-batch:mixed", rate=50.0, duration=20.0)
    share = sum(1 for t in mixed if t.task_type == "interactive") / len(mixed)
    assert share == pytest.approx(0.7, abs=0.05)
    assert {t.calls[0].slo_class for t in mixed} == {"interactive", "batch"}
    queue = schedule("chat-batch:queue", rate=10.0, duration=10.0)
    batch = [t for t in queue if t.task_type == "batch"]
    assert len(batch) == 30
    assert all(t.at_s == 0.0 for t in batch)


def test_sharegpt_lengths_have_the_stated_means() -> None:
    tasks = schedule("sharegpt-like", rate=500.0, duration=20.0)
    prompts = [t.calls[0].prompt_tokens for t in tasks]
    outputs = [t.calls[0].output_tokens for t in tasks]
    assert statistics.mean(prompts) == pytest.approx(161, rel=0.1)
    assert statistics.mean(outputs) == pytest.approx(338, rel=0.1)
    assert max(prompts) <= 2048
    assert max(outputs) <= 1024


@pytest.mark.parametrize(
    ("variant", "ttft_ms", "atgt_ms"),
    [("aladdin-7b", 400.0, 15.0), ("aladdin-13b", 600.0, 30.0), ("aladdin-70b", 1600.0, 75.0)],
)
def test_sharegpt_aladdin_variants_keep_the_lengths_and_set_the_slos(
    variant: str, ttft_ms: float, atgt_ms: float
) -> None:
    plain = schedule("sharegpt-like", rate=50.0, duration=10.0)
    tasks = schedule(f"sharegpt-like:{variant}", rate=50.0, duration=10.0)
    assert get_workload(f"sharegpt-like:{variant}").name == f"sharegpt-like:{variant}"
    assert [(t.at_s, t.calls[0].prompt_tokens, t.calls[0].output_tokens) for t in tasks] == [
        (t.at_s, t.calls[0].prompt_tokens, t.calls[0].output_tokens) for t in plain
    ]
    assert {t.calls[0].slo for t in tasks} == {Slo(ttft_ms=ttft_ms, atgt_ms=atgt_ms)}
    headers = build_headers(tasks[0], tasks[0].calls[0], {}, slo_scale=1.0, slo_headers=True)
    assert headers["x-berth-ttft-ms"] == f"{ttft_ms:.0f}"
    assert headers["x-berth-itl-ms"] == f"{atgt_ms:.0f}"
    assert "x-berth-deadline-ms" not in headers


@pytest.mark.parametrize(("kind", "cv"), [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_arrival_rate_and_burstiness(kind: str, cv: float) -> None:
    times = arrival_times(kind, 50.0, 400.0, random.Random(7), cv=cv)  # type: ignore[arg-type]
    assert len(times) / 400.0 == pytest.approx(50.0, rel=0.1)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    measured = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert measured == pytest.approx(cv, rel=0.15)


def test_unknown_workloads() -> None:
    for bad in ("nope", "coding:pattern9", "sharegpt-like:x", "multi-model:zipf"):
        with pytest.raises(ValueError, match=r"unknown|no variants"):
            get_workload(bad)


def test_allot_is_proportional() -> None:
    assert allot(50_000, [5, 15, 5]) == [10_000, 30_000, 10_000]


def test_slo_met_and_scaled() -> None:
    slo = Slo(ttft_ms=100, atgt_ms=10, e2e_ms=1000)
    assert slo.met(50, 5, 900)
    assert not slo.met(150, 5, 900)
    assert not slo.met(50, 20, 900)
    assert not slo.met(50, 5, 1100)
    assert not slo.met(None, None, 900)
    assert slo.scaled(0.1) == Slo(ttft_ms=10, atgt_ms=1, e2e_ms=100)


@pytest.mark.parametrize("n", [1, 7, 100, 3000, 40_000])
def test_prompt_text_length(n: int) -> None:
    text = prompt_text(n, salt=n)
    assert len(text) == 4 * n
    assert text.isascii()
    assert prompt_text(n, 1) != prompt_text(n, 2) or n < 3


def test_request_body_and_headers() -> None:
    call = CallSpec(100, 20, api="chat", slo=Slo(ttft_ms=500), slo_class="interactive", priority=2)
    task = TaskSpec(3, 0.0, "generation", (call,), task_sla_ms=4000, task_id="t-3")
    body = orjson.loads(build_body(call, "m", salt=1))
    assert body["max_tokens"] == body["min_tokens"] == 20
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["priority"] == 2
    assert len(body["messages"][0]["content"]) == 4 * (100 - CHAT_TEMPLATE_TOKENS)
    headers = build_headers(task, call, {"Authorization": "Bearer k"}, slo_scale=0.5, slo_headers=True)
    assert headers["x-berth-slo-class"] == "interactive"
    assert headers["x-berth-task-id"] == "t-3"
    assert headers["x-berth-task-sla-ms"] == "2000"
    assert headers["x-berth-ttft-ms"] == "250"
    assert "x-berth-deadline-ms" not in headers
    assert headers["Authorization"] == "Bearer k"
    completion = orjson.loads(build_body(CallSpec(10, 2, api="completion"), "m", salt=0))
    assert len(completion["prompt"]) == 40


def test_trace_round_trip(tmp_path: Path) -> None:
    tasks = schedule("coding:pattern2", rate=5.0, duration=4.0)
    path = tmp_path / "trace.jsonl"
    with path.open("wb") as f:
        for t in tasks:
            for i in range(len(t.calls)):
                line = trace_line(t, i, f"model-{t.calls[i].model_slot}", t.at_s)
                line["observed"] = {"ok": True}
                f.write(orjson.dumps(line) + b"\n")
    loaded = load_trace(path)
    assert len(loaded) == len(tasks)
    for orig, back in zip(tasks, loaded, strict=True):
        assert back.at_s == pytest.approx(orig.at_s, abs=1e-6)
        assert back.task_type == orig.task_type
        assert back.task_id == orig.task_id
        assert back.task_sla_ms == orig.task_sla_ms
        assert back.sla_metric == orig.sla_metric
        assert [c.prompt_tokens for c in back.calls] == [c.prompt_tokens for c in orig.calls]
        assert [c.model for c in back.calls] == [f"model-{c.model_slot}" for c in orig.calls]
        assert [c.slo for c in back.calls] == [c.slo for c in orig.calls]
    assert len(load_trace(path, duration_s=2.0)) == sum(1 for t in tasks if t.at_s < 2.0)
    assert get_workload(str(path)).name == "trace:trace.jsonl"


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (b'{"prompt_tokens": 1, "output_tokens": 1}', ".at"),
        (b'{"at": 0, "prompt_tokens": 0, "output_tokens": 1}', ".prompt_tokens"),
        (b'{"at": 0, "prompt_tokens": 1, "output_tokens": 1, "api": "embed"}', ".api"),
        (b"[1]", "JSON object"),
        (b"{bad", ":1"),
    ],
    ids=["no-at", "zero-prompt", "api", "not-object", "bad-json"],
)
def test_trace_errors_name_the_line(tmp_path: Path, line: bytes, fragment: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(line + b"\n")
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert f"{path}:1" in str(e.value)
    assert fragment in str(e.value)
