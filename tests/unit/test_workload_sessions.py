"""Workloads with sessions: multi-turn chat resends the conversation under its application's system
prompt; coding's developer sessions resend their repository context; the options are checked."""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest

from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import WorkloadOptions, get_workload
from loadgen.workloads.base import CallSpec, TaskSpec
from loadgen.workloads.coding import TASK_SLA_MS
from loadgen.workloads.prompt import Prompt
from loadgen.workloads.stats import reusable_share
from loadgen.workloads.trace import TraceError, load_trace, trace_line


def schedule(
    spec: str,
    options: WorkloadOptions | None = None,
    *,
    rate: float = 4.0,
    duration: float = 60.0,
    seed: int = 1,
) -> list[TaskSpec]:
    run = RunOptions(target="x", workload=spec, rate=rate, duration_s=duration, seed=seed)
    return build_schedule(get_workload(spec, options), run)


def prompt_of(call: CallSpec) -> Prompt:
    assert call.prompt is not None
    assert call.prompt.tokens(call.api) == call.prompt_tokens
    return call.prompt


def test_chat_turns_resend_the_conversation_so_far() -> None:
    tasks = schedule("chat", WorkloadOptions(turns=(2, 5), think_time_s=3.0))
    assert tasks
    for t in tasks:
        assert 2 <= len(t.calls) <= 5
        assert t.task_id is not None  # a conversation is one task
        assert t.calls[0].gap_before_s == 0.0
        assert all(c.gap_before_s > 0 for c in t.calls[1:])
        for prev, cur in zip(t.calls, t.calls[1:], strict=False):
            a, b = prompt_of(prev), prompt_of(cur)
            # the turn before, its answer (what the simulator answered), then a new user message
            assert b.messages[: len(a.messages)] == a.messages
            assert [m.role for m in b.messages[len(a.messages) :]] == ["assistant", "user"]
            assert b.messages[len(a.messages)].tokens == prev.output_tokens
            assert b.rendered("chat").startswith(a.rendered("chat")[: -len("<|assistant|>\n")])
    think = [c.gap_before_s for t in tasks for c in t.calls[1:]]
    assert statistics.fmean(think) == pytest.approx(3.0, rel=0.25)


def test_chat_applications_share_their_system_prompts() -> None:
    tasks = schedule("chat", WorkloadOptions(apps=3, system_tokens=(800, 800)), rate=10.0)
    systems = Counter(prompt_of(t.calls[0]).messages[0] for t in tasks)
    assert len(systems) == 3
    assert all(m.role == "system" and m.tokens == 800 for m in systems)
    said = [m for t in tasks for m in prompt_of(t.calls[-1]).messages if m.role == "user"]
    assert len(said) == sum(len(t.calls) for t in tasks)  # a conversation's last turn resends them all
    assert len({m.spans for m in said}) == len(said)  # each user message is text of its own


def test_chat_sessions_fix_the_number_of_conversations() -> None:
    tasks = schedule("chat", WorkloadOptions(sessions=17), rate=100.0, duration=30.0)
    assert len(tasks) == 17
    assert max(t.at_s for t in tasks) < 30.0 * 3


def test_chat_reuses_most_blocks_and_depends_on_the_seed() -> None:
    a = schedule("chat")
    assert reusable_share(a, block_tokens=16, seed=1).share > 0.5
    b = schedule("chat", seed=2)
    texts_a = {prompt_of(t.calls[0]).rendered("chat") for t in a}
    texts_b = {prompt_of(t.calls[0]).rendered("chat") for t in b}
    assert not texts_a & texts_b  # another seed, other words: a live fleet's caches start cold


def test_coding_without_sessions_sends_text_of_its_own() -> None:
    tasks = schedule("coding:pattern1")
    assert all(c.prompt is None for t in tasks for c in t.calls)


def test_coding_sessions_keep_one_repository_context() -> None:
    opts = WorkloadOptions(sessions=3, context_tokens=(2000, 4000))
    tasks = schedule("coding:pattern2", opts, rate=10.0)
    plain = schedule("coding:pattern2", rate=10.0)
    assert Counter(t.task_type for t in tasks).keys() == Counter(t.task_type for t in plain).keys()
    contexts: dict[object, set[str]] = defaultdict(set)
    for t in tasks:
        assert t.task_sla_ms == TASK_SLA_MS[t.task_type]
        first = prompt_of(t.calls[0])
        context, _own = first.messages
        assert context.role == "system"
        assert 2000 <= context.tokens <= 4000
        for c in t.calls:
            assert prompt_of(c).messages[0] == context  # every call of the task resends it
        contexts[context].add(t.task_type)
        if len(t.calls) == 2:
            second = prompt_of(t.calls[1])
            assert second.messages[:2] == first.messages
            assert second.messages[2].tokens == t.calls[0].output_tokens
            assert second.messages[3].tokens == {"generation": 64, "translation": 16}[t.task_type]
            budgets = [v for c in t.calls for v in (c.slo.ttft_ms, c.slo.e2e_ms) if v is not None]
            assert sum(budgets) == pytest.approx(t.task_sla_ms)
    assert len(contexts) == 3
    stats = reusable_share(tasks, block_tokens=16, seed=1)
    assert stats.share > 0.6


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("coding", WorkloadOptions(context_tokens=(10, 20)), "needs --sessions"),
        ("coding", WorkloadOptions(turns=(1, 2)), "--turns does not apply"),
        ("sharegpt-like", WorkloadOptions(sessions=2), "--sessions does not apply"),
        ("chat", WorkloadOptions(time_scale=2.0), "--time-scale does not apply"),
        ("chat:long", None, "no variants"),
        ("chat", WorkloadOptions(turns=(3, 2)), "--turns must be"),
        ("chat", WorkloadOptions(apps=0), "--apps must be"),
        ("chat", WorkloadOptions(think_time_s=-1.0), "--think-time"),
        ("maaso", WorkloadOptions(slo_ttft_ms=0.0), "--slo-ttft-ms must be"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_options_are_checked(spec: str, options: WorkloadOptions | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_workload(spec, options)


def test_slo_flags_set_every_requests_targets_and_headers() -> None:
    tasks = schedule("sharegpt-like", WorkloadOptions(slo_ttft_ms=700.0, slo_itl_ms=40.0))
    assert tasks
    for t in tasks:
        for c in t.calls:
            assert (c.slo.ttft_ms, c.slo.atgt_ms, c.slo_headers) == (700.0, 40.0, True)
    assert all(not c.slo_headers for t in schedule("sharegpt-like") for c in t.calls)


def test_a_recording_keeps_the_prompts(tmp_path: Path) -> None:
    """`--record` writes each call's prompt spans and SLO-header choice, and a replay sends them again."""
    opts = WorkloadOptions(turns=(2, 3), slo_ttft_ms=900.0)
    tasks = schedule("chat", opts, rate=2.0, duration=5.0)
    path = tmp_path / "sent.jsonl"
    with path.open("wb") as f:
        for t in tasks:
            for i in range(len(t.calls)):
                f.write(orjson.dumps(trace_line(t, i, "m", t.at_s)) + b"\n")
    back = load_trace(path)
    assert [len(t.calls) for t in back] == [len(t.calls) for t in tasks]
    for orig, replayed in zip(tasks, back, strict=True):
        for a, b in zip(orig.calls, replayed.calls, strict=True):
            assert b.prompt == a.prompt
            assert b.slo_headers
            assert b.prompt_tokens == a.prompt_tokens


@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        ([{"role": "user", "spans": [["s", 1, 10]]}], "makes 10 tokens"),
        ([{"role": "robot", "spans": []}], ".prompt[0]"),
        ([{"role": "user", "spans": [["s", -1, 16]]}], ".prompt[0].spans[0]"),
        ([], "non-empty list"),
    ],
    ids=["tokens", "role", "span", "empty"],
)
def test_a_recorded_prompt_is_checked(tmp_path: Path, prompt: object, fragment: str) -> None:
    line = {"at": 0, "api": "completion", "prompt_tokens": 16, "output_tokens": 1, "prompt": prompt}
    path = tmp_path / "t.jsonl"
    path.write_bytes(orjson.dumps(line) + b"\n")
    with pytest.raises(TraceError, match=re.escape(fragment)):
        load_trace(path)
