"""Plain-text views of reports: the per-run table and ``compare`` side by side with ratios."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# (report key, column header, unit): every table prints the units in a second header row.
_CLASS_COLS: tuple[tuple[str, str, str], ...] = (
    ("count", "n", "req"),
    ("errors", "err", "req"),
    ("goodput", "goodput", "0-1"),  # the fraction of requests that met their SLO
    ("ttft_p50_ms", "ttft50", "ms"),
    ("ttft_p95_ms", "ttft95", "ms"),
    ("ttft_p99_ms", "ttft99", "ms"),
    ("e2e_p50_ms", "e2e50", "ms"),
    ("e2e_p95_ms", "e2e95", "ms"),
    ("e2e_p99_ms", "e2e99", "ms"),
    ("itl_p50_ms", "itl50", "ms"),
    ("throughput_rps", "rate", "req/s"),
    ("output_tokens_per_s", "output", "tok/s"),
)
_TASK_COLS: tuple[tuple[str, str, str], ...] = (
    ("count", "n", "tasks"),
    ("errors", "err", "tasks"),
    ("goodput", "goodput", "0-1"),
    ("calls", "calls", "max/task"),
    ("sla_metric", "sla of", ""),  # ttft or e2e: not a number
    ("sla_ms", "sla", "ms"),
    ("latency_p50_ms", "lat50", "ms"),
    ("latency_p95_ms", "lat95", "ms"),
    ("latency_p99_ms", "lat99", "ms"),
)
COMPARE_METRICS: tuple[str, ...] = (
    "count",
    "errors",
    "goodput",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "e2e_p99_ms",
    "throughput_rps",
)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    return str(v)


def _table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], units: Sequence[str] | None = None
) -> list[str]:
    """Aligned columns; `units` (one per column, "" for none) is a second header row."""
    heads = [headers] if units is None else [headers, units]
    widths = [max(len(c) for c in col) for col in zip(*heads, *rows, strict=True)]
    lines = [
        "  ".join(
            h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True))
        ).rstrip()
        for head in heads
    ]
    for r in rows:
        lines.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
    return lines


def format_report(data: dict[str, Any]) -> str:
    run = data.get("run", {})
    out = [
        f"berth-loadgen: {run.get('workload')} at {run.get('rate')} tasks/s for {run.get('duration_s')} s "
        f"({run.get('arrival')}) against {run.get('target')}, wall {run.get('wall_s')} s",
        "",
    ]
    rows = [[name, *(_cell(st.get(k)) for k, _, _ in _CLASS_COLS)] for name, st in data["classes"].items()]
    rows.append(["(overall)", *(_cell(data["overall"].get(k)) for k, _, _ in _CLASS_COLS)])
    out += _table(["class", *(h for _, h, _ in _CLASS_COLS)], rows, ["", *(u for _, _, u in _CLASS_COLS)])
    tasks = data.get("tasks", {})
    if any(t.get("multi_step") or t.get("sla_ms") is not None for t in tasks.values()):
        out.append("")
        trows = [[name, *(_cell(st.get(k)) for k, _, _ in _TASK_COLS)] for name, st in tasks.items()]
        out += _table(["task", *(h for _, h, _ in _TASK_COLS)], trows, ["", *(u for _, _, u in _TASK_COLS)])
    errors = data.get("errors_by_kind") or {}
    if errors:
        out.append("")
        out.append("errors: " + ", ".join(f"{k}={v}" for k, v in errors.items()))
    cpu = data.get("cpu", {})
    procs = cpu.get("processes", {})
    if procs:
        out.append("")
        parts = []
        for name, p in procs.items():
            cpu_s, share = p.get("cpu_s"), p.get("cpu_share")
            used = "-" if cpu_s is None else f"{cpu_s:.1f} s"
            if share is not None:
                used += f" = {share * 100:.0f} %"
            parts.append(f"{name} (pid {p.get('pid')}) {used}")
        wall = run.get("wall_s")
        over = f"over the {wall:.1f} s run" if isinstance(wall, int | float) else "over the run"
        out.append(f"cpu time {over} (100 % = one core busy throughout): " + ", ".join(parts))
        for name in cpu.get("flagged", []):
            out.append(
                f"WARNING: {name} used more than {cpu.get('threshold', 0.8) * 100:.0f} % of a core; "
                "results may be limited by CPU, not by the fleet"
            )
    return "\n".join(out)


def _ratio(a: Any, b: Any) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or isinstance(a, bool) or a == 0:
        return "-"
    return f"{b / a:.2f}x"


def format_compare(reports: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Reports side by side, each column after the first followed by its ratio to the first."""
    if not reports:
        return ""
    headers = ["scope", "metric"]
    for i, (name, _) in enumerate(reports):
        headers.append(name)
        if i:
            headers.append(f"/{reports[0][0]}"[:12])
    scopes: list[str] = ["(overall)"]
    for _, data in reports:
        for cls in data.get("classes", {}):
            if cls not in scopes:
                scopes.append(cls)
    rows: list[list[str]] = []
    for scope in scopes:
        for metric in COMPARE_METRICS:
            row = [scope, metric]
            base: Any = None
            for i, (_, data) in enumerate(reports):
                st = data["overall"] if scope == "(overall)" else data.get("classes", {}).get(scope, {})
                v = st.get(metric)
                row.append(_cell(v))
                if i == 0:
                    base = v
                else:
                    row.append(_ratio(base, v))
            rows.append(row)
    return "\n".join(_table(headers, rows))
