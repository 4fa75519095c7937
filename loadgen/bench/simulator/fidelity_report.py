"""The fidelity benchmark's markdown report: the summary per pair of runs (live and simulated), each task
type's goodput, the evidence behind a miss and the findings, from the figures and checks of
`loadgen.bench.simulator.fidelity_compare`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.bench.simulator.fidelity_compare import (
    PROBE_TYPE,
    Check,
    Pair,
    Tolerances,
    failed,
    path_cost,
    types_outside,
)


def _f(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _diff(c: Check) -> str:
    d = c.diff
    if d is None:
        return "-"
    return f"{d:+.3f}" if c.kind == "abs" else f"{d * 100:+.0f}%"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _check(checks: Sequence[Check], name: str) -> Check | None:
    return next((c for c in checks if c.name == name), None)


def summary_rows(pairs: Sequence[Pair], types: Sequence[str]) -> list[list[str]]:
    rows = []
    for p in pairs:
        g = _check(p.checks, "goodput")
        t = _check(p.checks, "p95 TTFT")
        row = [
            p.policy,
            f"{p.rate:g}",
            f"{_f(p.live.goodput)} / {_f(p.sim.goodput)}",
            "-" if g is None else _diff(g),
            f"{_ms(p.live.ttft_p95_ms)} / {_ms(p.sim.ttft_p95_ms)}",
            "-" if t is None else _diff(t),
        ]
        for name in types:
            c = _check(p.checks, f"p95 TTFT {name}")
            if c is None:
                row.append("-")
            else:
                mark = "" if c.ok else " ✗"
                row.append(f"{_ms(c.live)} / {_ms(c.sim)} ({_diff(c)}){mark}")
        row.append("PASS" if p.passed else "FAIL")
        row.append("yes" if not types_outside(p.checks) else "no")
        rows.append(row)
    return rows


def type_goodput_rows(pairs: Sequence[Pair], types: Sequence[str]) -> list[list[str]]:
    rows = []
    for p in pairs:
        row = [p.policy, f"{p.rate:g}"]
        for name in types:
            c = _check(p.checks, f"goodput {name}")
            row.append("-" if c is None else f"{_f(c.live)} / {_f(c.sim)} ({_diff(c)})")
        row.append(f"{p.live.refused} / {p.sim.refused}")
        rows.append(row)
    return rows


def evidence_rows(pairs: Sequence[Pair]) -> list[list[str]]:
    rows = []
    for p in pairs:
        cost = path_cost(p)
        cpu = p.live_run.get("cpu", {})

        def share(name: str, what: str, cpu: Mapping[str, Any] = cpu) -> str:
            return _share(cpu.get(name, {}).get(what))

        rows.append(
            [
                p.policy,
                f"{p.rate:g}",
                f"{share('berth', 'cpu_share')} / {share('berth', 'runqueue_share')}",
                f"{share('sim', 'cpu_share')} / {share('sim', 'runqueue_share')}",
                f"{share('loadgen', 'cpu_share')} / {share('loadgen', 'runqueue_share')}",
                "yes" if p.live_run.get("valid", True) else "NO",
                f"{_ms(cost['queue_p50_live_ms'])} / {_ms(cost['queue_p50_sim_ms'])}",
                f"{_ms(cost['queue_p95_live_ms'])} / {_ms(cost['queue_p95_sim_ms'])}",
                _ms(cost["service_p50_extra_ms"]),
                f"{p.live.tasks} / {p.sim.tasks}",
            ]
        )
    return rows


def findings(pairs: Sequence[Pair], tol: Tolerances) -> list[str]:
    """Plain statements read off the figures (the report's interpretation is the reader's)."""
    out: list[str] = []
    if not pairs:
        return ["- nothing was compared"]
    n_pass = sum(p.passed for p in pairs)
    out.append(f"- {n_pass} of {len(pairs)} comparisons pass.")
    for p in pairs:
        bad = failed(p.checks)
        if bad:
            what = "; ".join(
                f"{c.name}: live {_f(c.live) if c.kind == 'abs' else _ms(c.live)}, "
                f"sim {_f(c.sim) if c.kind == 'abs' else _ms(c.sim)} ({_diff(c)})"
                for c in bad
            )
            out.append(f"- {p.policy} at {p.rate:g}: FAIL on {what}")
    for p in pairs:
        outside = [c for c in types_outside(p.checks) if not c.gate]
        if outside:
            what = ", ".join(f"{c.name.removeprefix('p95 TTFT ')} {_diff(c)}" for c in outside)
            out.append(
                f"- {p.policy} at {p.rate:g}: per-type P95 TTFT outside ±{tol.ttft * 100:.0f} %: {what}"
            )
    extra = [c for p in pairs if (c := path_cost(p)["service_p50_extra_ms"]) is not None]
    if extra:
        out.append(
            f"- past berth's queue, a live {PROBE_TYPE} call takes {min(extra):.0f}-{max(extra):.0f} "
            "simulated ms longer (median) than the simulator's: the live path's per-call cost (two HTTP "
            "hops, berth's relay, the engine simulator's timers), which the simulator leaves out."
        )
    invalid = [f"{p.policy}@{p.rate:g}" for p in pairs if not p.live_run.get("valid", True)]
    if invalid:
        out.append(
            f"- live runs flagged CPU-starved by the scheduling benchmark's rule: {', '.join(invalid)}"
        )
    return out


def markdown(pairs: Sequence[Pair], meta: Mapping[str, Any], tol: Tolerances | None = None) -> str:
    tol = tol or Tolerances()
    types = sorted({t for p in pairs for t in (*p.live.types, *p.sim.types)})
    lines = [
        "# Simulator fidelity: `loadgen/fleetsim` against the live path",
        "",
        f"Setting: {meta.get('setting', '')}",
        "",
        f"Targets: task goodput within ±{tol.goodput:.2f} (absolute) and P95 TTFT within "
        f"±{tol.ttft * 100:.0f} % of the live run's"
        + (
            " (overall and per task type)"
            if tol.per_type_ttft
            else '; each task type\'s P95 TTFT against the same band in "every type" (not judged: see '
            "`loadgen/bench/simulator/fidelity_compare.py`)"
        )
        + ". Latencies in simulated ms (the live run's, measured at speed "
        f"x{meta.get('speed', '?')}, are multiplied back by the speed). Cells: live / sim (difference).",
        "",
        "## Verdicts",
        "",
    ]
    header = [
        "policy",
        "rate",
        "goodput",
        "Δ",
        "p95 TTFT",
        "Δ",
        *(f"p95 TTFT {t}" for t in types),
        "verdict",
        "every type",
    ]
    lines += _table(header, summary_rows(pairs, types))
    lines += ["", "## Goodput per task type (shown, not judged)", ""]
    lines += _table(
        ["policy", "rate", *(f"goodput {t}" for t in types), "refused calls"], type_goodput_rows(pairs, types)
    )
    lines += [
        "",
        "## What the live path adds",
        "",
        "cpu / wait: share of one core used / share of the run spent waiting for a CPU while runnable. "
        f"queue: berth's queue time per call (median, P95). extra service: the live run's median "
        f"({PROBE_TYPE} calls) of TTFT minus queue time, minus the simulator's. tasks: live / sim.",
        "",
    ]
    lines += _table(
        [
            "policy",
            "rate",
            "berth cpu/wait",
            "engine sim cpu/wait",
            "loadgen cpu/wait",
            "valid",
            "queue p50 live/sim",
            "queue p95 live/sim",
            "extra service p50",
            "tasks",
        ],
        evidence_rows(pairs),
    )
    lines += ["", "## Findings", "", *findings(pairs, tol), ""]
    left_out = meta.get("left_out")
    if left_out:
        lines += ["## What the simulator leaves out (its own report)", "", *(f"- {x}" for x in left_out), ""]
    return "\n".join(lines)
