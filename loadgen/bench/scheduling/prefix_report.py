"""The prefix-cache benchmark's report: means over seeds with 95 % Student t intervals
(`scheduling_stats.mean_ci`), the targets judged on the means, the markdown and the plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from loadgen.bench.scheduling.prefix_setup import (
    BERTH,
    CONFIGS,
    DAY_ONE,
    FREE_PREFILL,
    NO_PREFIX,
    ORACLE,
    PEERS,
    PRECISE,
    WORKLOADS,
)
from loadgen.bench.scheduling.scheduling_stats import mean_ci
from loadgen.report import Report

METRICS: Final = (
    "goodput",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "e2e_p90_ms",
    "output_tokens_per_s",
    "hit_rate",
)
PEER_BELOW: Final = 0.90  # the targets are judged where the best peer's goodput falls below this
GOODPUT_MARGIN: Final = 0.10
TTFT_RATIO: Final = 0.5
HIT_APPROX: Final = 0.75
HIT_PRECISE: Final = 0.9
CONTROL_COST: Final = 0.01

Summary = dict[str, dict[str, dict[str, Any]]]  # "workload@load" -> config -> metric -> {mean, half, n}


def _key(workload: str, load: float) -> str:
    return f"{workload}@{load:g}"


def figures(report: Report) -> dict[str, Any]:
    """A run's figures from its loadgen report."""
    reqs = report.requests
    ttft = np.array([r.ttft_s for r in reqs if r.ok and r.ttft_s is not None], dtype=np.float64)
    e2e = np.array([r.e2e_s for r in reqs if r.ok and r.e2e_s is not None], dtype=np.float64)

    def pct(a: np.ndarray[Any, Any], q: float) -> float | None:
        return round(float(np.percentile(a, q)) * 1000.0, 1) if len(a) else None

    overall = report.data.get("overall", {})
    cache = report.data.get("simulation", {}).get("prefix_cache", {})
    return {
        "requests": len(reqs),
        "errors": sum(1 for r in reqs if not r.ok),
        "goodput": round(sum(1 for r in reqs if r.slo_met) / len(reqs), 4) if reqs else None,
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p90_ms": pct(ttft, 90),
        "ttft_p99_ms": pct(ttft, 99),
        "e2e_p50_ms": pct(e2e, 50),
        "e2e_p90_ms": pct(e2e, 90),
        "output_tokens_per_s": overall.get("output_tokens_per_s"),
        "hit_rate": cache.get("hit_rate"),
        "hit_tokens": cache.get("hits_tokens"),
        "queried_tokens": cache.get("queries_tokens"),
    }


def summarize_runs(runs: Sequence[dict[str, Any]]) -> Summary:
    """Per (workload, load) and configuration, each metric's mean over the seeds and its 95 % interval."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((_key(r["workload"], r["load"]), r["config"]), []).append(r)
    out: Summary = {}
    for (key, config), rs in groups.items():
        cell: dict[str, dict[str, Any]] = {}
        for m in METRICS:
            vals = [float(r[m]) for r in rs if r.get(m) is not None]
            if vals:
                c = mean_ci(vals)
                cell[m] = {
                    "mean": round(c.mean, 4),
                    "half": None if c.half is None else round(c.half, 4),
                    "n": c.n,
                }
        cell["schedules"] = {"mean": len({r["schedule"] for r in rs}), "half": None, "n": len(rs)}
        out.setdefault(key, {})[config] = cell
    return out


def _mean(s: Summary, key: str, config: str, metric: str) -> float:
    cell = s.get(key, {}).get(config, {}).get(metric)
    return math.nan if cell is None else float(cell["mean"])


def best_peer(s: Summary, key: str) -> str | None:
    """The peer policy with the highest mean goodput at `key`."""
    peers = [(p, _mean(s, key, p, "goodput")) for p in PEERS if p in s.get(key, {})]
    peers = [(p, g) for p, g in peers if not math.isnan(g)]
    return max(peers, key=lambda x: x[1])[0] if peers else None


def target_load(s: Summary, workload: str, loads: Sequence[float]) -> tuple[float | None, bool]:
    """(the first load where the best peer's goodput < 0.90, whether it crossed there; else the heaviest
    load and False)."""
    for load in sorted(loads):
        key = _key(workload, load)
        peer = best_peer(s, key)
        if peer is not None and _mean(s, key, peer, "goodput") < PEER_BELOW:
            return load, True
    return (max(loads) if loads else None), False


def _check(name: str, value: float, target: float, ok: bool, load: float | None) -> dict[str, Any]:
    return {
        "load": load,
        "target": name,
        "value": None if math.isnan(value) else round(value, 4),
        "bound": None if math.isnan(target) else round(target, 4),
        "passed": bool(ok),
        "note": "",
    }


def verdicts(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per workload, its targets' checks (value, the bound it is held to, passed)."""
    s: Summary = result["summary"]
    loads = result["setup"]["loads"]
    configs = set(result["setup"]["configs"])
    out: dict[str, list[dict[str, Any]]] = {}
    for workload in result["setup"]["workloads"]:
        checks: list[dict[str, Any]] = []
        if WORKLOADS[workload].shared and BERTH in configs:
            load, crossed = target_load(s, workload, loads)
            key = _key(workload, load) if load is not None else ""
            peer = best_peer(s, key)
            where = f"at load {load:g}"
            if peer is not None and not crossed:
                checks.append(
                    {
                        "load": load,
                        "target": f"the best peer ({peer}) below 0.90 goodput within the sweep",
                        "value": round(_mean(s, key, peer, "goodput"), 4),
                        "bound": PEER_BELOW,
                        "passed": False,
                        "note": "not reached: the goodput and TTFT targets are shown at the heaviest load; "
                        "extend --loads upward",
                    }
                )
            if peer is not None:
                g, pg = _mean(s, key, BERTH, "goodput"), _mean(s, key, peer, "goodput")
                ok = g >= pg + GOODPUT_MARGIN
                check = _check(f"goodput >= {peer} + 0.10 {where}", g, pg + GOODPUT_MARGIN, ok, load)
                check["margin"] = GOODPUT_MARGIN
                check["peer_value"] = None if math.isnan(pg) else round(pg, 4)
                if FREE_PREFILL in configs:  # the preset with every prefill free: no cache gives more
                    fg = _mean(s, key, FREE_PREFILL, "goodput")
                    check["free_prefill_value"] = None if math.isnan(fg) else round(fg, 4)
                checks.append(check)
                t, pt = _mean(s, key, BERTH, "ttft_p90_ms"), _mean(s, key, peer, "ttft_p90_ms")
                check = _check(
                    f"TTFT p90 <= 0.5x {peer}'s {where}", t, TTFT_RATIO * pt, t <= TTFT_RATIO * pt, load
                )
                check["ttft"] = True
                checks.append(check)
            if ORACLE in configs:
                h, oh = _mean(s, key, BERTH, "hit_rate"), _mean(s, key, ORACLE, "hit_rate")
                checks.append(
                    _check(
                        f"engine hit rate >= 0.75x the oracle's {where}",
                        h,
                        HIT_APPROX * oh,
                        h >= HIT_APPROX * oh,
                        load,
                    )
                )
                if PRECISE in configs:
                    hp = _mean(s, key, PRECISE, "hit_rate")
                    checks.append(
                        _check(
                            f"precise source's engine hit rate >= 0.9x the oracle's {where}",
                            hp,
                            HIT_PRECISE * oh,
                            hp >= HIT_PRECISE * oh,
                            load,
                        )
                    )
        if not WORKLOADS[workload].shared and {BERTH, NO_PREFIX} <= configs:
            for load in loads:
                key = _key(workload, load)
                g, off = _mean(s, key, BERTH, "goodput"), _mean(s, key, NO_PREFIX, "goodput")
                checks.append(
                    _check(f"prefix awareness costs <= 0.01 goodput at load {load:g}", off - g, CONTROL_COST,
                           off - g <= CONTROL_COST, load)
                )  # fmt: skip
        if DAY_ONE in configs:
            for load in loads:
                key = _key(workload, load)
                peer = best_peer(s, key)
                if peer is None:
                    continue
                g, pg = _mean(s, key, DAY_ONE, "goodput"), _mean(s, key, peer, "goodput")
                checks.append(_check(f"day one >= {peer} at load {load:g}", g, pg, g >= pg, load))
        out[workload] = checks
    return out


def passed(result: dict[str, Any]) -> bool:
    return all(c["passed"] for checks in result.get("verdicts", {}).values() for c in checks)


# --------------------------------------------------------------------- markdown
def _cell(s: Summary, key: str, config: str, metric: str, digits: int) -> str:
    c = s.get(key, {}).get(config, {}).get(metric)
    if c is None:
        return "n/a"
    m = f"{c['mean']:.{digits}f}"
    return m if c["half"] is None else f"{m} ±{c['half']:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _direction(check: dict[str, Any], bound: dict[str, Any]) -> str:
    """Which way a missed target should move, given the workload's capacity bound."""
    if check["passed"]:
        return ""
    floor = bound.get("ttft_p90_floor_ms")
    if check.get("ttft") and floor is not None and check["bound"] is not None and floor > check["bound"]:
        return (
            f"out of reach: with every call served, each alone on an idle engine with a perfect cache, the "
            f"TTFT p90 is {floor:.0f} ms (`prefix_bound`), so the target should move up to at least that"
        )
    best = bound.get("goodput_bound", {}).get("goodput")
    margin = check.get("margin")
    free, peer = check.get("free_prefill_value"), check.get("peer_value")
    if free is not None and margin is not None and peer is not None and free - peer < margin:
        return (
            f"out of reach for prefix awareness: the preset on engines that prefill at no cost per token "
            f"(`free-prefill`, more than any cache saves) gets {free:.3f}, {free - peer:+.3f} over the best "
            "peer; the rest is the preset's decode scheduling, so the margin a cache can buy it is at most "
            "that (the placement bound, which knows no seats or queues, "
            + (f"allows {best:.3f})" if best is not None else "was not computed)")
        )
    if best is not None and margin is not None and check.get("peer_value") is not None:
        room = best - check["peer_value"]
        if room < margin:
            return (
                f"out of reach: no placement exceeds goodput {best:.3f} here (`prefix_bound`), "
                f"{room:+.3f} over the best peer, so the margin should move down to at most that"
            )
        return (
            f"within the bound: no placement exceeds goodput {best:.3f} here, {room:+.3f} over the best "
            "peer, so the target stands (a placement question)"
        )
    if bound.get("load_perfect_cache", 0.0) > 1.0:
        return (
            f"out of reach: even a perfect shared cache leaves load {bound['load_perfect_cache']:.2f} > 1, "
            "so the target should move to a lighter load"
        )
    return "within capacity: a placement question (the target stands)"


def markdown(result: dict[str, Any]) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    setup = result["setup"]
    s: Summary = result["summary"]
    v = verdicts(result)
    out = [
        "# Prefix-cache benchmark (fleet simulator)",
        "",
        f"{setup['endpoints']} endpoints of `{setup['profile']}` with prefix caching, one model; "
        f"{setup['seeds']} seeds, {setup['duration_s']:g} s of arrivals per run; trace `{setup['trace']}`; "
        f"{setup['elapsed_s']:.0f} s of wall time. Means with 95 % Student t half-widths.",
        "",
    ]
    for workload in setup["workloads"]:
        out += [
            f"## {workload}" + ("" if WORKLOADS[workload].shared else " (control: no shared prefixes)"),
            "",
        ]
        for load in setup["loads"]:
            key = _key(workload, load)
            b = result["bounds"].get(key, {})
            best = b.get("goodput_bound", {})
            out += [
                f"Load {load:g} (offered without caches {b.get('load', math.nan):.2f}, with a perfect shared "
                f"cache {b.get('load_perfect_cache', math.nan):.2f}; reusable blocks "
                f"{b.get('reusable_share', math.nan) * 100:.1f} %; no placement's goodput above "
                f"{best.get('goodput', math.nan):.3f}: calls that meet their SLO alone on an idle engine "
                f"with a perfect cache {best.get('feasible_share', math.nan):.3f}, their least engine time "
                f"{best.get('busy_ratio', math.nan):.2f} of the fleet's before the last deadline)",
                "",
            ]
            rows = []
            for config in setup["configs"]:
                if config not in s.get(key, {}):
                    continue
                rows.append(
                    [
                        config,
                        _cell(s, key, config, "goodput", 3),
                        _cell(s, key, config, "ttft_p50_ms", 0),
                        _cell(s, key, config, "ttft_p90_ms", 0),
                        _cell(s, key, config, "ttft_p99_ms", 0),
                        _cell(s, key, config, "e2e_p50_ms", 0),
                        _cell(s, key, config, "output_tokens_per_s", 0),
                        _cell(s, key, config, "hit_rate", 3),
                    ]
                )
            header = ["config", "goodput", "TTFT p50 ms", "p90", "p99", "E2E p50 ms", "out tok/s", "hit rate"]
            out += [*_table(header, rows), ""]
        checks = v.get(workload, [])
        if checks:
            out += ["Targets:", ""]
            for c in checks:
                mark = "PASS" if c["passed"] else "FAIL"
                at = result["bounds"].get(_key(workload, c["load"]), {}) if c["load"] is not None else {}
                extra = "" if c["note"] else _direction(c, at)
                why = "; ".join(x for x in (c["note"], extra) if x)
                out.append(
                    f"- {mark} {c['target']}: {c['value']} (bound {c['bound']})" + (f"; {why}" if why else "")
                )
            out.append("")
    out += [
        "The simulator's `oracle` reads each engine's true cache: precise knowledge with no event lag; its",
        "`precise` configuration feeds the engines' KV events to berth's event store at each arrival.",
        "",
        f"Targets: {'all met' if all(c['passed'] for cs in v.values() for c in cs) else 'not all met'}.",
        "",
    ]
    return "\n".join(out), v


# --------------------------------------------------------------------- plot
def plot(result: dict[str, Any], path: Path) -> str | None:
    """Goodput and TTFT p90 against load, per workload and configuration; None when written, else why
    not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (the `plot` extra)"
    setup = result["setup"]
    s: Summary = result["summary"]
    loads = sorted(setup["loads"])
    fig, axes = plt.subplots(
        2, len(setup["workloads"]), figsize=(4.5 * len(setup["workloads"]), 7), squeeze=False
    )
    for i, workload in enumerate(setup["workloads"]):
        for config in setup["configs"]:
            keys = [_key(workload, x) for x in loads]
            g = [_mean(s, k, config, "goodput") for k in keys]
            t = [_mean(s, k, config, "ttft_p90_ms") / 1000.0 for k in keys]
            style = "-" if config not in PEERS else "--"
            axes[0][i].plot(loads, g, style, marker="o", label=config)
            axes[1][i].plot(loads, t, style, marker="o", label=config)
        axes[0][i].set_title(workload)
        axes[0][i].set_ylabel("goodput")
        axes[1][i].set_ylabel("TTFT p90 (s)")
        axes[1][i].set_xlabel("offered load (no cache)")
        axes[1][i].set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


__all__ = ["CONFIGS", "figures", "markdown", "passed", "plot", "summarize_runs", "verdicts"]
