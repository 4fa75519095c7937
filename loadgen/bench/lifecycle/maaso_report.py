"""MaaSO's benchmark report: the rows (means over seeds with 95 % Student t intervals per configuration
and burstiness), the targets judged on them, and the markdown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gateway.sched.heterogeneous import Placement
from loadgen.bench.lifecycle.maaso_setup import (
    HEADROOM_SHARE_TARGET,
    HETERO,
    HOMOGENEOUS,
    PLAIN,
    SCALED,
    SCALED_DEFAULT,
    Config,
    Run,
)
from loadgen.bench.scheduling.scheduling_stats import MeanCI, mean_ci


def _rows(cfg: Config, runs: Sequence[Run], placements: dict[float, Placement]) -> list[dict[str, Any]]:
    rows = []
    for cv in cfg.cvs:
        for config in cfg.configs:
            mine = [r for r in runs if r.cv == cv and r.config == config]
            if not mine:
                continue

            def ci(key: str, rs: Sequence[Run] = mine) -> dict[str, Any] | None:
                vals = [float(r.figures[key]) for r in rs if r.figures[key] is not None]
                if not vals:
                    return None
                m: MeanCI = mean_ci(vals)
                return {"mean": round(m.mean, 4), "ci95": None if m.half is None else round(m.half, 4)}

            rows.append(
                {
                    "cv": cv,
                    "config": config,
                    "instances": _count(mine[0].instances),
                    "attainment": ci("attainment"),
                    "attainment_tight": ci("attainment_tight"),
                    "attainment_relaxed": ci("attainment_relaxed"),
                    "e2e_p50_ms": ci("e2e_p50_ms"),
                    "e2e_p95_ms": ci("e2e_p95_ms"),
                    "output_tokens_per_s": ci("output_tokens_per_s"),
                    "runs": len(mine),
                }
            )
    return rows


def _count(instances: Sequence[str]) -> str:
    names = sorted(set(instances), key=instances.index)
    return " + ".join(f"{instances.count(n)}x {n}" for n in names)


def _mean(rows: Sequence[dict[str, Any]], cv: float, config: str) -> float:
    for r in rows:
        if r["cv"] == cv and r["config"] == config and r["attainment"] is not None:
            return float(r["attainment"]["mean"])
    return math.nan


def headroom_share(value: float, base: float) -> float:
    """The share of `base`'s headroom (1 - base) that `value` gains: 1 when it meets every deadline."""
    if base >= 1.0:
        return 1.0 if value >= 1.0 else -math.inf
    return (value - base) / (1.0 - base)


def _target(name: str, value: float, base: float, *, judged: bool = True) -> dict[str, Any]:
    share = headroom_share(value, base)
    finite = math.isfinite(share)  # no attainment (nothing ran), or the baseline at 1 and the row below it
    return {
        "name": name,
        "measured": round(share, 4) if finite else None,
        "gain": round(value / base - 1.0, 4) if base > 0 else None,
        "target": HEADROOM_SHARE_TARGET,
        "judged": judged,
        "passed": finite and share >= HEADROOM_SHARE_TARGET,
    }


def _targets(cfg: Config, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per burstiness: the heterogeneous placement's share of plain replication's headroom (judged), and
    over the best homogeneous configuration (shown); the scaler's configuration choice over plain
    replication (judged) and over the scaler with the default configuration (shown), when those ran."""
    out = []
    for cv in cfg.cvs:
        het = _mean(rows, cv, HETERO)
        plain = _mean(rows, cv, PLAIN)
        best = max(v for c in HOMOGENEOUS if not math.isnan(v := _mean(rows, cv, c)))  # plain always ran
        out.append(_target(f"heterogeneous over plain replication (tp1-b32), cv {cv:g}", het, plain))
        out.append(
            _target(
                f"heterogeneous over the best homogeneous configuration, cv {cv:g}", het, best, judged=False
            )
        )
        scaled = _mean(rows, cv, SCALED)
        if not math.isnan(scaled):  # the scaled rows ran
            out.append(
                _target(f"scaler + next_config over plain replication (tp1-b32), cv {cv:g}", scaled, plain)
            )
            out.append(
                _target(
                    f"scaler + next_config over the scaler with the default configuration, cv {cv:g}",
                    scaled,
                    _mean(rows, cv, SCALED_DEFAULT),
                    judged=False,
                )
            )
    return out


def markdown(result: dict[str, Any]) -> str:
    s = result["setup"]
    lines = [
        "## MaaSO: heterogeneous instances vs homogeneous replication",
        "",
        f"{s['devices']} devices of `{s['profile']}` at speed {s['speed']:g} (two-device instances "
        f"{s['tp2_speedup']:g}x faster), the `maaso` workload at {s['rate']:g} req/s for "
        f"{s['duration_s']:g} s "
        f"(deadline factors 0.8-1.5 x decode 300-1000 x t_slot {s['t_slot_ms']:g} ms, gamma arrivals), "
        f"seeds {s['seeds']}{' (quick)' if s['quick'] else ''}. Means over seeds with 95 % intervals.",
        "",
        "Placements (the placer's analytic score):",
        "",
    ]
    for cv, pl in result["placements"].items():
        lines.append(
            f"- cv {cv}: strict {_count(pl['instances']['strict']) or '-'} "
            f"({pl['devices']['strict']} devices), relaxed {_count(pl['instances']['relaxed']) or '-'} "
            f"({pl['devices']['relaxed']} devices), score {pl['score']}"
        )
    lines += [
        "",
        "| cv | configuration | instances | attainment | tight | relaxed | e2e p50 ms | e2e p95 ms "
        "| tokens/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['cv']:g} | {r['config']} | {r['instances']} | {_ci_text(r['attainment'])} | "
            f"{_ci_text(r['attainment_tight'])} | {_ci_text(r['attainment_relaxed'])} | "
            f"{_ci_text(r['e2e_p50_ms'], 0)} | {_ci_text(r['e2e_p95_ms'], 0)} | "
            f"{_ci_text(r['output_tokens_per_s'], 0)} |"
        )
    lines += [
        "",
        "Targets: the share of the baseline's headroom (1 - its attainment) gained; "
        f"wanted >= {HEADROOM_SHARE_TARGET:.0%}. Rows marked (shown) are not judged.",
        "",
        "| target | share of headroom | attainment gain | verdict |",
        "| --- | --- | --- | --- |",
    ]
    for t in result["targets"]:
        gain = "-" if t["gain"] is None else f"{t['gain']:+.1%}"
        verdict = "PASS" if t["passed"] else "FAIL"
        shown = verdict if t["judged"] else f"({verdict}, shown)"
        share = "-" if t["measured"] is None else f"{t['measured']:.0%}"
        lines.append(f"| {t['name']} | {share} | {gain} | {shown} |")
    lines += ["", "Bound: no placement can gain more than 1 / (the baseline's attainment) − 1:", ""]
    for cv, ceiling in ceilings(result["rows"]).items():
        lines.append(f"- cv {cv:g}: at most {ceiling:+.1%} over plain replication")
    scaled = ceilings(result["rows"], SCALED_DEFAULT)
    if scaled:
        lines += [
            "",
            "Bound for the scaler's configuration choice (over the scaler with the default one):",
            "",
        ]
        lines += [f"- cv {cv:g}: at most {ceiling:+.1%}" for cv, ceiling in scaled.items()]
    return "\n".join(lines) + "\n"


def ceilings(rows: Sequence[dict[str, Any]], baseline: str = PLAIN) -> dict[float, float]:
    """Per burstiness, the largest relative gain any placement could have over `baseline`'s row."""
    out = {}
    for r in rows:
        if r["config"] == baseline and r["attainment"] is not None and r["attainment"]["mean"] > 0:
            out[float(r["cv"])] = 1.0 / float(r["attainment"]["mean"]) - 1.0
    return out


def _ci_text(v: dict[str, Any] | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    m = f"{v['mean']:.{digits}f}"
    return m if v["ci95"] is None else f"{m} ±{v['ci95']:.{digits}f}"
