"""How `bench simscale` reads its points: the curve's per-event cost and log-log slopes, memory split
into per-endpoint and per-request growth, a verdict line per target, the tables' rows, the report."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

#: The engine profile of every simulated endpoint.
PROFILE: Final = "fleet-7b"


class ReportConfig(Protocol):
    """What the report says of the benchmark's configuration (`sim_scale.ScaleConfig`)."""

    @property
    def cpus(self) -> tuple[int, ...] | None: ...
    @property
    def curve_duration_s(self) -> float: ...
    @property
    def max_run(self) -> int: ...
    @property
    def policy(self) -> Path: ...
    @property
    def profile(self) -> bool: ...
    @property
    def rate_per_endpoint(self) -> float: ...
    @property
    def shares(self) -> bool: ...
    @property
    def workload(self) -> str: ...


#: The headline's target: 100,000 requests over 100 endpoints within this many seconds of wall time.
HEADLINE_TARGET_S: Final = 60.0
HEADLINE_REQUESTS: Final = 100_000
#: A headline of fewer requests than this share of `HEADLINE_REQUESTS` (a quick run,
#: `--headline-requests 20000`) is not judged against the target; its line gives the wall time 100,000
#: requests would take at its pace instead (Poisson arrivals make a run of 100,000 a few hundred short).
JUDGED_SHARE: Final = 0.95
#: Wall time per event may grow this much from the smallest to the largest fleet and still count as
#: near-linear in events.
LINEAR_SLACK: Final = 1.5
#: The target for the curve: wall time against simulated requests, log-log slope at most this.
SLOPE_TARGET: Final = 1.05
#: Requests per endpoint must differ this much between points to split memory into the two parts.
MEMORY_SPREAD: Final = 3.0


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The least-squares slope of log y on log x (1: linear; 2: quadratic); None with < 2 points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def curve_summary(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How wall time grows along the curve: per event, and the log-log slopes against events and
    endpoints."""
    us_per_event = [1e6 * p["wall_s"] / p["events"] if p["events"] else None for p in points]
    first, last = us_per_event[0] if us_per_event else None, us_per_event[-1] if us_per_event else None
    growth = None if first is None or last is None or first == 0 else last / first
    return {
        "us_per_event": [None if u is None else round(u, 2) for u in us_per_event],
        "us_per_event_growth": None if growth is None else round(growth, 3),
        "slope_wall_vs_events": _r(
            loglog_slope([p["events"] for p in points], [p["wall_s"] for p in points])
        ),
        "slope_wall_vs_endpoints": _r(
            loglog_slope([p["endpoints"] for p in points], [p["wall_s"] for p in points])
        ),
        "slope_wall_vs_requests": _r(
            loglog_slope([p["requests"] for p in points], [p["wall_s"] for p in points])
        ),
        "slope_cpu_vs_requests": _r(
            loglog_slope([p["requests"] for p in points], [p.get("cpu_s", p["wall_s"]) for p in points])
        ),
        "near_linear": growth is not None and growth <= LINEAR_SLACK,
    }


def headline_judged(headline: dict[str, Any]) -> str:
    """The headline's wall time against its target: MET or NOT MET for a run of the target's size
    (`JUDGED_SHARE` of `HEADLINE_REQUESTS` or more); for a shorter run, not judged, with the wall time
    `HEADLINE_REQUESTS` would take at its pace."""
    target = f"target <= {HEADLINE_TARGET_S:g} s wall on one core"
    if headline["requests"] >= JUDGED_SHARE * HEADLINE_REQUESTS:
        return f"{'MET' if headline['wall_s'] <= HEADLINE_TARGET_S else 'NOT MET'} ({target})"
    pace = headline["wall_s"] / max(headline["requests"], 1) * HEADLINE_REQUESTS
    return (
        f"not judged ({target} is for {HEADLINE_REQUESTS:,} requests; at this run's pace they would "
        f"take about {pace:.0f} s)"
    )


def verdicts(headline: dict[str, Any] | None, curve: Sequence[dict[str, Any]]) -> list[str]:
    """One line per target of the simulator: the headline's wall time, the curve's slope, peak memory
    (stated, no target)."""
    out = []
    if headline is not None:
        out.append(
            f"VERDICT headline: {headline['requests']:,} requests over {headline['endpoints']} endpoints "
            f"({headline['policy']}) in {headline['wall_s']:.1f} s wall ({headline['cpu_s']:.1f} s CPU): "
            f"{headline_judged(headline)}"
        )
    if len(curve) >= 2:
        s = curve_summary(curve)
        slope = s["slope_wall_vs_requests"]
        ok = slope is not None and slope <= SLOPE_TARGET
        sizes = " -> ".join(str(p["endpoints"]) for p in curve)
        out.append(
            f"VERDICT curve: wall time against simulated requests over {sizes} endpoints, log-log slope "
            f"{slope} (CPU time: {s['slope_cpu_vs_requests']}): {'MET' if ok else 'NOT MET'} "
            f"(target <= {SLOPE_TARGET:g})"
        )
    points = ([headline] if headline is not None else []) + list(curve)
    if points:
        worst = max(points, key=lambda p: p["rss_peak_mib"])
        out.append(
            f"STATED peak memory: {worst['rss_peak_mib']:.0f} MiB RSS ({worst['label']}: "
            f"{worst['requests']:,} requests, {worst['endpoints']} endpoints; "
            f"{worst['rss_base_mib']:.0f} MiB after the imports)"
        )
    return out


def memory_model(points: Sequence[dict[str, Any]]) -> dict[str, float] | None:
    """RSS growth over the imports as `per_endpoint` MiB x endpoints + `per_request` KiB x requests, by
    least squares over the points; None unless requests per endpoint differ by MEMORY_SPREAD between
    the points (else the two parts cannot be told apart: the curve alone has the same load everywhere)."""
    rows = [(p["endpoints"], p["requests"], p["rss_peak_mib"] - p["rss_base_mib"]) for p in points]
    ratios = [r / e for e, r, _ in rows if e > 0 and r > 0]
    if len(ratios) < 2 or max(ratios) < MEMORY_SPREAD * min(ratios):
        return None
    a = np.array([[e, r / 1024.0] for e, r, _ in rows], dtype=np.float64)
    y = np.array([g for _, _, g in rows], dtype=np.float64)
    if np.linalg.matrix_rank(a) < 2:
        return None
    (per_endpoint, per_request_kib), *_ = np.linalg.lstsq(a, y, rcond=None)
    return {
        "per_endpoint_mib": round(float(per_endpoint), 3),
        "per_request_kib": round(float(per_request_kib), 3),
    }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def row(p: dict[str, Any]) -> list[str]:
    us = 1e6 * p["wall_s"] / p["events"] if p["events"] else float("nan")
    return [
        str(p["endpoints"]),
        f"{p['rate']:g}",
        f"{p['duration_sim_s']:g}",
        f"{p['requests']:,}",
        f"{p['events']:,}",
        f"{p['wall_s']:.1f}",
        f"{p['cpu_s']:.1f}",
        f"{p['requests_per_s']:,.0f}",
        f"{p['events_per_s']:,.0f}",
        f"{us:.1f}",
        f"{p['utilization']:.2f}" if p["utilization"] is not None else "-",
        f"{p['rss_base_mib']:.0f}",
        f"{p['rss_peak_mib']:.0f}",
    ]


HEADER: Final = [
    "endpoints",
    "req/s (sim)",
    "sim s",
    "requests",
    "events",
    "wall s",
    "cpu s",
    "requests/s",
    "events/s",
    "µs/event",
    "util",
    "RSS base MiB",
    "RSS peak MiB",
]


def markdown(cfg: ReportConfig, headline: dict[str, Any] | None, curve: Sequence[dict[str, Any]]) -> str:
    pin = "not pinned" if cfg.cpus is None else f"pinned to CPU {','.join(map(str, cfg.cpus))} (taskset)"
    if cfg.profile:
        pin += "; PROFILED (cProfile): wall times include its overhead"
    if cfg.shares:
        pin += "; berth's calls timed (`sim_share`): wall times include the timers"
    run = (
        "token by token (every decode iteration an event)"
        if cfg.max_run == 1
        else f"decode runs of up to {cfg.max_run} iterations as one event"
    )
    lines = [
        "# Fleet simulator: scale and speed",
        "",
        f"Fleet: one model on `{PROFILE}` endpoints (cap = max_num_seqs); workload `{cfg.workload}`, "
        f"policy `{cfg.policy.name}`, Poisson arrivals at {cfg.rate_per_endpoint:g} requests/s per endpoint; "
        f"the simulator {run}; each point in a fresh process {pin}. Load average at the end "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs.",
        "",
        "wall s: `simulate()` from the call to the report (the simulation and building its report); "
        "requests/s and events/s: simulated per wall second; util: mean share of endpoints busy; RSS "
        "base: after the imports, before the simulation.",
        "",
    ]
    if headline is not None:
        lines += [
            f"## (a) {headline['requests']:,} requests over {headline['endpoints']} endpoints",
            "",
            *table(HEADER, [row(headline)]),
            "",
            f"- wall {headline['wall_s']:.1f} s on one core: {headline_judged(headline)}; "
            f"{headline['requests_per_s']:,.0f} simulated requests/s, "
            f"{headline['events_per_s']:,.0f} events/s.",
            gc_line(headline),
            "",
        ]
    if curve:
        s = curve_summary(curve)
        lines += [
            f"## (b) wall time against fleet size (same load per endpoint, {cfg.curve_duration_s:g} "
            "simulated s)",
            "",
            *table(HEADER, [row(p) for p in curve]),
            "",
            f"- wall time per event: {', '.join(f'{u} µs' for u in s['us_per_event'])}: x"
            f"{s['us_per_event_growth']} from the smallest to the largest fleet "
            f"({'near-linear in events' if s['near_linear'] else 'NOT near-linear in events'}: "
            f"limit x{LINEAR_SLACK:g}).",
            f"- log-log slope of wall time against events {s['slope_wall_vs_events']}, against endpoints "
            f"{s['slope_wall_vs_endpoints']}, against simulated requests {s['slope_wall_vs_requests']} "
            f"(CPU time: {s['slope_cpu_vs_requests']}; 1 = linear, 2 = quadratic).",
            "",
        ]
    points = ([headline] if headline is not None else []) + list(curve)
    if points:
        worst = max(points, key=lambda p: p["rss_peak_mib"])
        lines += [
            "## (c) memory",
            "",
            f"- largest peak RSS {worst['rss_peak_mib']:.0f} MiB ({worst['label']}: {worst['requests']:,} "
            f"requests, {worst['endpoints']} endpoints); {worst['rss_base_mib']:.0f} MiB of it are the "
            "interpreter and the imports.",
        ]
        model = memory_model(points)
        if model is not None:
            lines.append(
                f"- growth over the imports, fitted over every point: {model['per_endpoint_mib']:.2f} MiB "
                f"per endpoint + {model['per_request_kib']:.2f} KiB per request (the simulator keeps every "
                "request's and task's result for its report)."
            )
        lines.append("")
    shared = [p for p in points if p.get("shares_s")]
    if shared:
        lines += ["## (d) where the wall time goes", ""]
        parts = ["scheduler", "telemetry", "admission", "simulator"]
        rows = [
            [p["label"], f"{p['wall_s']:.1f}"]
            + [
                f"{p['shares_s'].get(k, 0.0):.1f} ({100 * p['shares_s'].get(k, 0.0) / p['wall_s']:.0f} %)"
                for k in parts
            ]
            for p in shared
        ]
        lines += [*table(["point", "wall s", *parts], rows), ""]
    lines += ["## Verdicts", "", *(f"- {v}" for v in verdicts(headline, curve)), ""]
    return "\n".join(lines)


def gc_line(p: dict[str, Any]) -> str:
    """The collector's work during a point: collections per generation and their seconds."""
    gc = p.get("gc") or {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0]}
    n, s = gc["collections"], gc["seconds"]
    return (
        f"- collector `{p.get('collector', 'cpython')}`: {n[0]:,} / {n[1]:,} / {n[2]:,} collections of "
        f"generation 0 / 1 / 2, {sum(s):.2f} s in them ({' / '.join(f'{x:.2f}' for x in s)})."
    )
