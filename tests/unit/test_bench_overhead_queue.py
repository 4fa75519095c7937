"""The overhead benchmark's standing-queue phase, its arithmetic: berth's scheduler calls in a window from
two readings of `GET /admin/sched-decisions`, the phase's targets and table, its berth configuration, and
the workload requests its clients send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config.load import load_gateway_config
from gateway.core.clock import FakeClock
from gateway.core.decisiontime import DecisionTimes
from loadgen.bench.overhead.overhead_lag import LagReading
from loadgen.bench.overhead.overhead_queue import berth_config, client_command, queue_checks, queue_lines
from loadgen.bench.overhead.overhead_report import QUEUE, Measurement
from loadgen.bench.overhead.overhead_workload import WorkloadRequests
from loadgen.bench.overhead.proxy import parse_args
from loadgen.bench.overhead.queue_window import (
    ALL,
    GC,
    OVER,
    OVER_CPU,
    decision_window,
    gc_window,
    late_lag,
    over_limit,
    over_limit_cpu,
)


def _reading(times: DecisionTimes, after: int = 1 << 62) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(orjson.dumps(times.document(after)))  # as the route answers
    return doc


def test_the_window_counts_only_the_calls_between_the_readings() -> None:
    clock = FakeClock()
    times = DecisionTimes(clock=clock.now)
    times.record("complete", 0.020)  # before the window: the fill's burst, not counted
    before = _reading(times)
    for _ in range(98):
        times.record("complete", 0.0003)
    times.record("complete", 0.0042)  # slow (>= 2 ms): kept, its exact time is the window's longest
    times.record("complete", 0.0061)
    times.record("tick", 0.0004)
    after = _reading(times, before["slow_taken"])
    w = decision_window(before, after)
    assert set(w) == {"complete", "tick", ALL}
    c = w["complete"]
    assert c["calls"] == 100
    assert c["p50_le_ms"] == pytest.approx(0.5)
    assert c["p99_le_ms"] == pytest.approx(5.0)
    assert c["over_limit"] == 1
    assert c["max_ms"] == pytest.approx(6.1)
    assert w["tick"] == {"calls": 1, "p50_le_ms": 0.5, "p99_le_ms": 0.5, "over_limit": 0, "max_ms": 0.5}
    assert w[ALL]["calls"] == 101
    assert w[ALL]["max_ms"] == pytest.approx(6.1)


def test_without_slow_calls_kept_the_longest_is_its_bucket_bound() -> None:
    times = DecisionTimes(keep=1)
    before = _reading(times)
    times.record("submit", 0.003)
    times.record("submit", 0.030)  # the only slow call kept is this one; the other fell out
    times.record("submit", 0.002)
    after = _reading(times, before["slow_taken"])
    w = decision_window(before, after)
    assert w["submit"]["max_ms"] == pytest.approx(50.0)  # 30 ms was dropped: its bucket's bound
    assert w["submit"]["over_limit"] == 1


def _queue(
    config: str, lag_ms: list[float], decisions: dict[str, dict[str, float]] | None = None
) -> Measurement:
    return Measurement(
        round=0, phase=QUEUE, config=config, concurrency=1200, max_tokens=32, completed=1000, errors=3,
        window_s=10.0, rps=100.0, lat_ms={}, ttft_ms={}, chunks=0, proxy_cpu_s=4.0, upstream_cpu_s=None,
        lag_s=tuple(v / 1000.0 for v in lag_ms), decisions=decisions or {},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("berth_p99", "longest", "verdicts"),
    [
        pytest.param(1.4, 3.0, ["PASS", "PASS"], id="within"),
        pytest.param(1.6, 3.0, ["FAIL", "PASS"], id="lag"),
        pytest.param(1.2, 7.5, ["PASS", "FAIL"], id="decision"),
    ],
)
def test_the_targets_are_lag_against_the_bare_proxy_and_the_longest_call(
    berth_p99: float, longest: float, verdicts: list[str]
) -> None:
    bare = _queue("bare", [0.2] * 98 + [1.0] * 2)
    berth = _queue("berth", [0.2] * 98 + [berth_p99] * 2, {ALL: {"calls": 10.0, "max_ms": longest}})
    cs = queue_checks([bare, berth], 100, 1000)
    assert [c.verdict for c in cs] == verdicts
    assert cs[0].bare == pytest.approx(1.0)
    assert "queue of 1000" in cs[0].name


def test_no_berth_no_targets_and_the_table_shows_both_proxies() -> None:
    bare = _queue("bare", [0.2, 0.3])
    assert queue_checks([bare], 100, 1000) == []
    berth = _queue("berth", [0.3, 0.5], {
        "submit": {"calls": 5.0, "p50_le_ms": 0.5, "p99_le_ms": 1.0, "over_limit": 0.0, "max_ms": 0.9},
        ALL: {"calls": 5.0, "p50_le_ms": 0.5, "p99_le_ms": 1.0, "over_limit": 0.0, "max_ms": 0.9,
              "queued_before": 990.0, "queued_after": 1004.0},
    })  # fmt: skip
    text = "\n".join(queue_lines([bare, berth], 100, 1000))
    assert "event-loop lag p99 ms" in text
    assert "990 / 1004" in text
    assert "submit" in text
    assert "0.40" in text  # proxy CPU: 4 s over 10 s
    assert "garbage collections" not in text  # none read


def test_the_gc_window_counts_the_collections_between_the_readings_and_their_late_samples() -> None:
    def doc(counts: tuple[int, int, int], sums: tuple[float, float, float], taken: int) -> dict[str, Any]:
        gens = {
            str(g): {"count": counts[g], "sum_s": sums[g], "max_s": 0.2, "collected": 0} for g in range(3)
        }
        return {"generations": gens, "recent_s": 0.001, "taken": taken, "pauses": []}

    before = doc((100, 5, 1), (0.1, 0.05, 0.2), taken=7)
    after = doc((130, 6, 1), (0.13, 0.09, 0.2), taken=9)
    after["pauses"] = [[10.497, 0, 0.004], [11.99, 1, 0.04]]
    reading = LagReading(taken=3, samples_s=(0.008, 0.006, 0.045), taken_at=(10.5, 11.0, 12.0))
    got = gc_window(before, after, reading)
    assert got["gen0_count"] == 30
    assert got["gen1_count"] == 1
    assert got["gen2_count"] == 0
    assert got["gen1_sum_ms"] == pytest.approx(40.0)
    assert (got["gen0_max_ms"], got["gen1_max_ms"], got["gen2_max_ms"]) == pytest.approx((4.0, 40.0, 0.0))
    assert got["late_during_gc"] == 2  # the first and the last sample waited on a collection
    berth = _queue("berth", [0.3, 0.5], {GC: got})
    text = "\n".join(queue_lines([berth], 100, 1000))
    assert "gen1 1 (40 ms, CPU 0 ms, longest 40.0)" in text
    assert "waited while a collection of >= 1 ms ran: 2" in text


def test_berth_runs_the_preset_with_the_seats_and_long_queues(tmp_path: Path) -> None:
    args = parse_args(["--tests", "queue", "--queue-depth", "1000", "--queue-cap", "3"])
    path = berth_config(args, tmp_path)
    cfg = load_gateway_config(path)
    assert cfg.limits.default_endpoint_cap == 3
    assert cfg.upstream.pool_total >= args.fleet_count * 3  # a connection for every seat
    assert cfg.limits.max_queue_per_model >= 1000
    assert cfg.ops.loop_lag_interval_s == pytest.approx(0.01)
    assert cfg.policy_file is not None
    assert cfg.policy_file.name == "coding-assistant.toml"
    cmd = client_command(args, "http://127.0.0.1:1", 7)
    assert cmd.concurrency == args.fleet_count * 3 + 1000
    assert (cmd.workload, cmd.abandon, cmd.cpu_pids) == ("coding:pattern1", True, (7,))


def test_the_quick_form_is_small() -> None:
    args = parse_args(["--quick", "--tests", "queue"])
    assert args.tests == ["queue"]
    assert args.fleet_count * args.queue_cap + args.queue_depth < 100
    assert parse_args([]).tests == ["sat", "lat8", "lat1", "stream", "fleet"]  # not by default


def test_the_workload_requests_carry_the_presets_headers_and_capped_output() -> None:
    reqs = WorkloadRequests("coding:pattern1", "bench", sla_scale=10.0, max_output_tokens=8, seed=3)
    seen = set()
    ids = []
    for _ in range(400):
        task = reqs.next_task()
        ids.append(task.task_id)
        for i in range(len(task.calls)):
            body, headers = reqs.request(task, i)
            doc = orjson.loads(body)
            assert doc["model"] == "bench"
            assert doc["max_tokens"] <= 8
            assert doc["stream"] is False
            assert "stream_options" not in doc
            seen.add(headers["x-berth-slo-class"])
            assert float(headers["x-berth-task-sla-ms"]) >= 1200.0 * 10.0
    assert seen == {"completion", "generation", "translation", "summarization"}
    assert len(set(ids)) == len(ids)


def test_the_schedule_starts_again_with_fresh_task_ids() -> None:
    reqs = WorkloadRequests("coding:pattern1", "bench")
    n = len(reqs._tasks)
    first = [reqs.next_task().task_id for _ in range(n)]
    again = [reqs.next_task().task_id for _ in range(n)]
    assert not set(first) & set(again)
    assert all(t is not None and t.endswith("-1") for t in again)


def test_late_lag_samples_are_matched_with_the_slow_calls_that_ran_while_they_waited() -> None:
    # samples (taken at, seconds late): on time, late during a submit, late with no call, late during two
    reading = LagReading(
        taken=4,
        samples_s=(0.0002, 0.008, 0.006, 0.020),
        taken_at=(10.0, 10.5, 11.0, 12.0),
    )
    slow = [
        [10.497, "submit", 0.004],  # ran 10.493-10.497: inside the second sample's wait (10.492-10.5)
        [10.9, "complete", 0.003],  # ended before the third sample's wait began (10.994)
        [11.99, "complete", 0.005],  # both inside the fourth's wait (11.98-12.0)
        [11.995, "tick", 0.002],
    ]
    got = late_lag(reading, slow)
    assert got == {
        "late_samples": 3.0,
        "late_during_calls": 2.0,
        "late_during_submit": 1.0,
        "late_during_complete": 1.0,
        "late_during_tick": 1.0,
    }


@pytest.mark.parametrize("name", ["least-outstanding", "default"])
def test_a_baseline_runs_with_the_coding_classes(name: str, tmp_path: Path) -> None:
    args = parse_args(["--tests", "queue", "--queue-policy", name])
    cfg = load_gateway_config(berth_config(args, tmp_path))
    assert cfg.policy_file is not None
    assert cfg.policy_file.parent == tmp_path
    assert 'name = "translation"' in cfg.policy_file.read_text()


def test_the_calls_over_the_limit_are_listed_one_by_one_in_time_order() -> None:
    slow = [[12.5, "submit", 0.0061], [10.25, "complete", 0.0059], [11.0, "tick", 0.003]]
    got = over_limit(slow, start=10.0)
    assert list(got) == ["complete@0.25", "submit@2.50"]
    assert list(got.values()) == pytest.approx([5.9, 6.1])
    berth = _queue("berth", [0.3, 0.5], {
        ALL: {"calls": 5.0, "p50_le_ms": 0.5, "p99_le_ms": 1.0, "over_limit": 2.0, "max_ms": 6.1},
        OVER: got,
    })  # fmt: skip
    text = "\n".join(queue_lines([berth], 100, 1000))
    assert "complete@0.25: 5.90, submit@2.50: 6.10" in text


def test_the_calls_over_the_limit_are_listed_with_their_cpu_and_the_waits_counted() -> None:
    """A daemon that keeps each slow call's CPU time: the calls over the limit are listed with it, and
    those whose CPU was under half their time are counted as the process waiting for a core; an entry
    without CPU (an older daemon, or null) is listed without it."""
    slow = [
        [12.5, "submit", 0.0081, 0.0012],  # 8.1 ms on the wall, 1.2 ms of CPU: waited for a core
        [10.25, "complete", 0.0059, 0.0057],  # its own work
        [13.0, "submit", 0.0070, None],  # CPU unknown
        [11.0, "tick", 0.003, 0.003],  # under the limit
    ]
    start = 10.0
    cpu = over_limit_cpu(slow, start)
    assert cpu == pytest.approx({"submit@2.50": 1.2, "complete@0.25": 5.7})
    assert over_limit_cpu([[12.5, "submit", 0.0081]], start) == {}  # three-element entries
    berth = _queue("berth", [0.3, 0.5], {
        ALL: {"calls": 5.0, "p50_le_ms": 0.5, "p99_le_ms": 1.0, "over_limit": 3.0, "max_ms": 8.1},
        OVER: over_limit(slow, start),
        OVER_CPU: cpu,
    })  # fmt: skip
    text = "\n".join(queue_lines([berth], 100, 1000))
    assert "complete@0.25: 5.90 (CPU 5.70), submit@2.50: 8.10 (CPU 1.20), submit@3.00: 7.00\n" in text
    assert "(the process waiting for a core): 1 of 2; CPU itself over 5 ms: 1; the most CPU: 5.70 ms" in text
