"""The prefix-misses diagnostic: each call classified by outcome and by where its session's prefix was."""

from __future__ import annotations

from loadgen.client import RequestResult
from loadgen.diag.prefix_misses import classify, table
from loadgen.workloads.base import CallSpec, Slo, TaskSpec
from loadgen.workloads.prompt import Message, Prompt, Span


def _task(index: int, session: int) -> TaskSpec:
    prompt = Prompt(
        (Message("system", (Span("s/repo", session, 100),)), Message("user", (Span("t", index, 8),)))
    )
    return TaskSpec(
        index, float(index), "generation", (CallSpec(110, 10, slo=Slo(e2e_ms=1_000.0), prompt=prompt),)
    )


def _result(task: int, sent: float, endpoint: str | None, *, met: bool, status: int = 200) -> RequestResult:
    r = RequestResult(
        task, 0, f"t{task}", "generation", "generation", "m", "chat", 110, 10, Slo(e2e_ms=1_000.0), sent
    )
    r.status, r.ok, r.slo_met, r.endpoint = status, status == 200, met, endpoint
    if r.ok:
        r.queue_ms, r.ttft_s, r.e2e_s = 100.0, 0.3, 1.5
    return r


def test_calls_are_placed_against_their_sessions_earlier_dispatches() -> None:
    tasks = [_task(0, 1), _task(1, 1), _task(2, 1), _task(3, 1), _task(4, 2)]
    results = [
        _result(0, 0.0, "e0", met=True),  # the session's first: no holder
        _result(1, 1.0, "e0", met=False),  # late on its holder
        _result(2, 2.0, "e1", met=False),  # late elsewhere while e0 held it
        _result(3, 3.0, None, met=False, status=429),  # refused, its session held
        _result(4, 4.0, "e1", met=True),  # another session: no holder although e1 served session 1
    ]
    got = classify(results, tasks)["generation"]
    assert {k: c.n for k, c in got.items()} == {
        ("on time", "no holder"): 2,
        ("late", "on holder"): 1,
        ("late", "off holder"): 1,
        ("refused", "held"): 1,
    }
    late = got[("late", "off holder")]
    assert late.queue_ms == [100.0]
    assert late.engine_ms == [200.0]  # dispatch to first token
    assert late.decode_ms == [1200.0]
    text = table(classify(results, tasks), len(results))
    assert "| generation | refused | held | 1 | 0.200 |" in text
