"""The run report: a versioned JSON document built from every request and task result.

Schema 1 (``"schema": 1``; fields are only ever added within a version)::

    {
      "schema": 1,
      "generator": "berth-loadgen",
      "run": {"target", "workload", "rate", "duration_s", "arrival", "cv", "seed", "slo_scale",
              "models": [...], "started_at_unix", "wall_s", "tasks_scheduled"},
      "overall":  STATS,
      "classes":  {CLASS: STATS},              # by the request's report class
      "tasks":    {TASK_TYPE: TASK_STATS},     # task level (multi-step tasks count once)
      "errors_by_kind": {KIND: n},             # see loadgen.client for the kinds
      "rejections_by_reason": {CODE: n},       # the OpenAI error code of every non-200 answer
      "cpu": {"threshold": 0.8, "processes": {NAME: {"pid", "cpu_s", "cpu_share", "flagged"}},
              "flagged": [NAME, ...]}
    }

    STATS = {"count", "ok", "errors", "goodput", "slo_met", "throughput_rps", "output_tokens_per_s",
             "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms",
             "itl_p50_ms", "itl_p99_ms", "atgt_mean_ms"}
    TASK_STATS = {"count", "ok", "errors", "goodput", "multi_step", "calls", "sla_metric", "sla_ms",
                  "latency_p50_ms", "latency_p95_ms", "latency_p99_ms"}
    # sla_metric/sla_ms: null for tasks without a task SLA (their goodput: every call met its SLO);
    # latency: task start to the first token (ttft) or the end (e2e) of its last call

Every request sent is counted exactly once, in ``overall`` and in exactly one class (so the class counts
sum to ``overall.count``); a failed request is an error and misses its SLO. ``goodput`` = requests (or
tasks) that met their SLO / all of them. Latency percentiles cover successful requests only (``null``
when there are none); ``itl_*`` are over every inter-token gap; throughputs divide by the run's wall
time (first arrival to last completion).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson

from loadgen.client import RequestResult
from loadgen.cpu import CPU_FLAG_THRESHOLD, CpuShare

SCHEMA_VERSION = 1
_T = TypeVar("_T")

#: GapHistogram's bins: log-spaced from 10 µs to 1000 s, each 1 % wider than the one before.
_GAP_LO = 1e-5
_GAP_GROWTH = 1.01
_GAP_BINS = int(np.ceil(np.log(1e3 / _GAP_LO) / np.log(_GAP_GROWTH))) + 1
_LOG_GROWTH = np.log(_GAP_GROWTH)


class GapHistogram:
    """Inter-token gaps as counts in log-spaced bins (1 % wide): quantiles within 1 % in a few KiB,
    however many tokens a run produces (the offline simulator keeps these instead of every gap)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = np.zeros(_GAP_BINS, dtype=np.int64)

    def add_many(self, gaps: Sequence[float]) -> None:
        # each gap's bin, floor(log(max(gap, lo) / lo) / log(growth)), in place over one array
        values = np.array(gaps, dtype=np.float64)
        np.maximum(values, _GAP_LO, out=values)
        values /= _GAP_LO
        np.log(values, out=values)
        values /= _LOG_GROWTH
        idx = values.astype(np.int64)
        np.minimum(idx, _GAP_BINS - 1, out=idx)
        self.counts += np.bincount(idx, minlength=_GAP_BINS)  # np.add.at's counts, several times faster

    def merged(self, other: GapHistogram) -> GapHistogram:
        out = GapHistogram()
        out.counts = self.counts + other.counts
        return out

    def quantile_ms(self, q: float) -> float | None:
        """The `q` percentile (0-100) in ms: the geometric middle of the bin it falls in."""
        total = int(self.counts.sum())
        if total == 0:
            return None
        rank = q / 100.0 * (total - 1)
        i = int(np.searchsorted(np.cumsum(self.counts), rank, side="right"))
        return round(float(_GAP_LO * _GAP_GROWTH ** (i + 0.5)) * 1000.0, 3)


@dataclass(slots=True)
class TaskResult:
    index: int
    task_id: str | None
    task_type: str
    at_s: float
    n_calls: int
    sla_ms: float | None
    sla_metric: str
    calls_sent: int = 0
    ok: bool = False
    latency_s: float | None = None
    met: bool = False


def complete_task(res: TaskResult, calls: Sequence[RequestResult], start_s: float) -> None:
    """A task whose every call succeeded: its latency (task start to the first token or the end of its
    last call, per its SLA metric; offsets from the run's start) and whether it met its SLA (without
    one: whether every call met its SLO)."""
    last = calls[-1]
    res.ok = True
    if res.sla_metric == "ttft" and last.ttft_s is not None:
        res.latency_s = last.sent_at_s + last.ttft_s - start_s
    elif last.e2e_s is not None:
        res.latency_s = last.sent_at_s + last.e2e_s - start_s
    if res.sla_ms is None:
        res.met = all(r.slo_met for r in calls)
    else:
        res.met = res.latency_s is not None and res.latency_s * 1000.0 <= res.sla_ms


@dataclass(slots=True)
class Report:
    data: dict[str, Any]
    requests: list[RequestResult] = field(default_factory=list)
    tasks: list[TaskResult] = field(default_factory=list)

    def to_json(self) -> bytes:
        return orjson.dumps(self.data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    def write(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_json() + b"\n")

    @property
    def overall(self) -> dict[str, Any]:
        return dict(self.data["overall"])

    @property
    def classes(self) -> dict[str, dict[str, Any]]:
        return dict(self.data["classes"])


def load_report(path: str | Path) -> dict[str, Any]:
    data = orjson.loads(Path(path).read_bytes())
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{path}: not a berth-loadgen report of schema {SCHEMA_VERSION}")
    return data


def _pct(values: Sequence[float] | np.ndarray[Any, Any], q: float) -> float | None:
    if len(values) == 0:
        return None
    return round(float(np.percentile(values, q)) * 1000.0, 3)


def _stats(
    results: Sequence[RequestResult], wall_s: float, hist: GapHistogram | None = None
) -> dict[str, Any]:
    """`hist`: the gaps of `results` as a histogram (their `gaps` arrays are then not read)."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    atgt = [r.atgt_s for r in ok if r.atgt_s is not None]
    if hist is None:
        gaps = np.concatenate([np.frombuffer(r.gaps, dtype=np.float64) for r in ok]) if ok else np.empty(0)
        itl_p50, itl_p99 = _pct(gaps, 50), _pct(gaps, 99)
    else:
        itl_p50, itl_p99 = hist.quantile_ms(50), hist.quantile_ms(99)
    met = sum(1 for r in results if r.slo_met)
    tokens = sum(r.tokens for r in ok)
    n = len(results)
    return {
        "count": n,
        "ok": len(ok),
        "errors": n - len(ok),
        "slo_met": met,
        "goodput": round(met / n, 6) if n else None,
        "throughput_rps": round(len(ok) / wall_s, 4) if wall_s > 0 else None,
        "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p95_ms": _pct(ttft, 95),
        "ttft_p99_ms": _pct(ttft, 99),
        "e2e_p50_ms": _pct(e2e, 50),
        "e2e_p95_ms": _pct(e2e, 95),
        "e2e_p99_ms": _pct(e2e, 99),
        "itl_p50_ms": itl_p50,
        "itl_p99_ms": itl_p99,
        "atgt_mean_ms": round(float(np.mean(atgt)) * 1000.0, 3) if atgt else None,
    }


def _task_stats(tasks: Sequence[TaskResult]) -> dict[str, Any]:
    ok = [t for t in tasks if t.ok]
    lat = [t.latency_s for t in ok if t.latency_s is not None]
    met = sum(1 for t in tasks if t.met)
    n = len(tasks)
    return {
        "count": n,
        "ok": len(ok),
        "errors": n - len(ok),
        "goodput": round(met / n, 6) if n else None,
        "multi_step": any(t.n_calls > 1 for t in tasks),
        "calls": max((t.n_calls for t in tasks), default=0),
        "sla_metric": next((t.sla_metric for t in tasks if t.sla_ms is not None), None),
        "sla_ms": next((t.sla_ms for t in tasks if t.sla_ms is not None), None),
        "latency_p50_ms": _pct(lat, 50),
        "latency_p95_ms": _pct(lat, 95),
        "latency_p99_ms": _pct(lat, 99),
    }


def _rejections(requests: Iterable[RequestResult]) -> dict[str, int]:
    """Non-200 answers by the OpenAI error code in their body (`unknown` when it has none)."""
    out: Counter[str] = Counter()
    for r in requests:
        if r.status and r.status != 200:
            code = None
            with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
                code = orjson.loads(r.detail or "")["error"]["code"]
            out[str(code) if code else "unknown"] += 1
    return dict(sorted(out.items()))


def _group(items: Iterable[_T], key: Callable[[_T], str]) -> dict[str, list[_T]]:
    out: dict[str, list[_T]] = {}
    for it in items:
        out.setdefault(key(it), []).append(it)
    return dict(sorted(out.items()))


def build_report(
    *,
    run: dict[str, Any],
    requests: list[RequestResult],
    tasks: list[TaskResult],
    wall_s: float,
    cpu: Sequence[CpuShare] = (),
    gaps: Mapping[str, GapHistogram] | None = None,
) -> Report:
    """`gaps`: each class's inter-token gaps as a histogram, instead of each request's `gaps`."""
    classes = _group(requests, lambda r: r.cls)
    by_type = _group(tasks, lambda t: t.task_type)
    errors = Counter(r.error or "error" for r in requests if not r.ok)
    overall_hist: GapHistogram | None = None
    if gaps is not None:
        overall_hist = GapHistogram()
        for h in gaps.values():
            overall_hist = overall_hist.merged(h)
    data: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "generator": "berth-loadgen",
        "run": {**run, "wall_s": round(wall_s, 3), "tasks_scheduled": len(tasks)},
        "overall": _stats(requests, wall_s, overall_hist),
        "classes": {
            name: _stats(rs, wall_s, None if gaps is None else gaps.get(name, GapHistogram()))
            for name, rs in classes.items()
        },
        "tasks": {name: _task_stats(ts) for name, ts in by_type.items()},
        "errors_by_kind": dict(sorted(errors.items())),
        "rejections_by_reason": _rejections(requests),
        "cpu": {
            "threshold": CPU_FLAG_THRESHOLD,
            "processes": {c.name: c.to_dict() for c in cpu},
            "flagged": [c.name for c in cpu if c.flagged],
        },
    }
    return Report(data, requests, tasks)
