"""The classes benchmark's figures per run, its report (tables, targets) and its plot over time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from loadgen.bench.scheduling.scheduling_stats import MeanCI, mean_ci
from loadgen.report import Report

#: Interactive attainment is plotted per window of this many simulated seconds (by send time).
WINDOW_S: Final = 30.0
ADAPTIVE_TARGET: Final = "adaptive cap >= 0.9x the best static cap's batch throughput, keeping ITL targets"


@dataclass(slots=True)
class Run:
    config: str
    rate: float
    seed: int
    cap: int  # the endpoints' configured (static or hard) cap
    figures: dict[str, Any] = field(default_factory=dict)
    timeline: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


CONFIG_ORDER: Final = (
    "a-least-outstanding",
    "b-classes",
    "c-preempt",
    "d-berth",
    "d-chiron-paper",
    "e-no-borrow",
    "f-no-reserve",
)


def summarize(report: Report) -> tuple[dict[str, Any], dict[str, Any]]:
    """(figures, timeline) of one simulated run."""
    inter = [r for r in report.requests if r.cls == "interactive"]
    batch = [r for r in report.requests if r.cls == "batch"]
    sim = report.data.get("simulation", {})
    met = sum(1 for r in inter if r.slo_met)
    with_itl = [r for r in report.requests if r.ok and r.atgt_s is not None and r.slo.atgt_ms is not None]
    itl_kept = [
        r for r in with_itl if r.slo.atgt_ms is not None and (r.atgt_s or 0.0) * 1000.0 <= r.slo.atgt_ms
    ]
    inter_itl = [r for r in with_itl if r.cls == "interactive"]
    ends = [r.sent_at_s + r.e2e_s for r in batch if r.ok and r.e2e_s is not None]
    done = bool(batch) and len(ends) == len(batch)
    last = max(ends, default=0.0)
    tokens = sum(r.tokens or 0 for r in batch)
    figures: dict[str, Any] = {
        "interactive_requests": len(inter),
        "interactive_attainment": round(met / len(inter), 4) if inter else 1.0,
        "interactive_itl_kept": round(
            sum(1 for r in inter_itl if (r.atgt_s or 0.0) * 1000.0 <= (r.slo.atgt_ms or math.inf))
            / len(inter_itl),
            4,
        )
        if inter_itl
        else 1.0,
        "itl_kept": round(len(itl_kept) / len(with_itl), 4) if with_itl else 1.0,
        "batch_requests": len(batch),
        "batch_finished": len(ends),
        "batch_tokens": tokens,
        "backlog_done_s": round(last, 1) if done else None,
        "batch_tokens_per_s": round(tokens / last, 1) if last > 0 else 0.0,
        "unfinished": sum(1 for r in report.requests if r.error == "unfinished"),
        "preemptions": int(sim.get("preemptions", 0)),
        "resumes": int(sim.get("resumes", 0)),
        "recomputed_tokens": int(sim.get("recomputed_tokens", 0)),
    }
    tl = report.data.get("fleet", {}).get("timeline", {})
    windows: dict[int, list[bool]] = {}
    for r in inter:
        windows.setdefault(int(r.sent_at_s // WINDOW_S), []).append(bool(r.slo_met))
    timeline = {
        "t_s": tl.get("t_s", []),
        "gateway_queued": tl.get("gateway_queued", []),
        "caps_by_class": tl.get("caps_by_class", {}),
        "attainment_window_s": WINDOW_S,
        "attainment": [[k * WINDOW_S, round(sum(v) / len(v), 4)] for k, v in sorted(windows.items()) if v],
    }
    return figures, timeline


def _ci(runs: Sequence[dict[str, Any]], key: str) -> MeanCI | None:
    vals = [float(r[key]) for r in runs if r.get(key) is not None]
    return mean_ci(vals) if vals else None


def _cell(c: MeanCI | None, digits: int = 3) -> str:
    return "n/a" if c is None else c.text(digits)


def _mean(c: MeanCI | None) -> float:
    return math.nan if c is None else c.mean


def markdown(result: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The report, and the targets' verdicts."""
    s = result["setup"]
    runs: list[dict[str, Any]] = result["runs"]
    lines = [
        "# Instance classes, preemption and adaptive caps (fleet simulator)",
        "",
        f"One model on {sum(s['fleet'].values())} endpoints of `{s['profile']}` "
        f"(max_num_seqs {s['engine_seats']}, KV "
        f"{s['kv_capacity_tokens']} tokens): "
        + ", ".join(f"{n} {cls}" for cls, n in s["fleet"].items())
        + ". Interactive chat (TTFT 10 s, ITL 200 ms) at the rates below for "
        f"{s['duration_s']:g} s, and a backlog of {s['backlog']} batch requests (TTFT 1 h, ITL 2 s) queued "
        f"at t = 0. {s['seeds']} seed(s); means with "
        f"95 % Student t intervals. Wall time {s['elapsed_s']} s.",
        "",
        "| rate | configuration | interactive attainment | ITL kept (all) | batch tok/s | backlog done (s) | "
        "preemptions | recomputed tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rate in s["rates"]:
        for config in CONFIG_ORDER:
            mine = [r for r in runs if r["rate"] == rate and r["config"] == config]
            if not mine:
                continue
            lines.append(
                f"| {rate:g} | {config} | {_cell(_ci(mine, 'interactive_attainment'))} | "
                f"{_cell(_ci(mine, 'itl_kept'))} | {_cell(_ci(mine, 'batch_tokens_per_s'), 0)} | "
                f"{_cell(_ci(mine, 'backlog_done_s'), 0)} | {_cell(_ci(mine, 'preemptions'), 0)} | "
                f"{_cell(_ci(mine, 'recomputed_tokens'), 0)} |"
            )
    sweep: list[dict[str, Any]] = result["sweep"]
    rate = result["sweep_rate"]
    lines += [
        "",
        f"## Static caps against the adaptive cap (rate {rate:g})",
        "",
        "| configuration | cap | interactive attainment | ITL kept (all) | batch tok/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    caps = sorted({r["cap"] for r in sweep})
    for cap in caps:
        mine = [r for r in sweep if r["cap"] == cap]
        lines.append(
            f"| c-preempt (static) | {cap} | {_cell(_ci(mine, 'interactive_attainment'))} | "
            f"{_cell(_ci(mine, 'itl_kept'))} | {_cell(_ci(mine, 'batch_tokens_per_s'), 0)} |"
        )
    d_runs = [r for r in runs if r["rate"] == rate and r["config"] == "d-berth"]
    lines.append(
        f"| d-berth (chiron) | <= 128 | {_cell(_ci(d_runs, 'interactive_attainment'))} | "
        f"{_cell(_ci(d_runs, 'itl_kept'))} | {_cell(_ci(d_runs, 'batch_tokens_per_s'), 0)} |"
    )
    verdicts = _verdicts(result, runs, sweep)
    lines += ["", "## Targets", "", crossing(runs, s["rates"]), ""]
    for v in verdicts:
        lines.append(f"- **{v['verdict']}** {v['target']}: {v['detail']}")
    info = _information(result, runs)
    if info:
        lines += ["", "At the other rates (information, not the target):", ""]
        lines += [f"- {x}" for x in info]
    lines += [
        "",
        "Interactive attainment: interactive requests that met TTFT and ITL (average token generation time); "
        "unfinished ones count as missed. ITL kept: finished requests (both kinds) whose average token time "
        "kept their class's target. Batch tok/s: batch output tokens over the time the backlog's last "
        "request finished. Recomputed tokens: prompt + produced tokens prefilled again when a preempted "
        "request resumed.",
        "",
    ]
    return "\n".join(lines), verdicts


def crossing(runs: Sequence[dict[str, Any]], rates: Sequence[float]) -> str:
    """Where (a)'s mean interactive attainment falls below 0.90, said as the sweep can tell it: between
    two rates of the sweep, at or below its lowest rate (it never kept 0.90), or beyond its highest."""
    means = []
    for rate in sorted(rates):
        c = _ci(
            [r for r in runs if r["rate"] == rate and r["config"] == "a-least-outstanding"],
            "interactive_attainment",
        )
        if c is not None:
            means.append((rate, c.mean))
    shown = ", ".join(f"{m:.3f} at {rate:g}" for rate, m in means)
    below = [i for i, (_, m) in enumerate(means) if m < 0.90]
    if not means:
        return "(a) did not run."
    if not below:
        return f"(a)'s interactive attainment ({shown}) keeps >= 0.90 at every rate: no target rate."
    i = below[0]
    if i == 0:
        return (
            f"(a)'s interactive attainment ({shown}) is below 0.90 already at the lowest rate, "
            f"{means[0][0]:g} req/s: the crossing is at or below it, and the targets are judged there."
        )
    return (
        f"(a)'s interactive attainment ({shown}) falls below 0.90 between {means[i - 1][0]:g} and "
        f"{means[i][0]:g} req/s: the targets are judged at {means[i][0]:g}."
    )


def _information(result: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    """(d)'s attainment and batch throughput against (a)'s at the rates other than the target's."""
    out = []
    for rate in result["setup"]["rates"]:
        if rate == result["target_rate"]:
            continue
        a = _ci(
            [r for r in runs if r["rate"] == rate and r["config"] == "a-least-outstanding"],
            "batch_tokens_per_s",
        )
        for config in ("d-berth", "e-no-borrow", "f-no-reserve"):
            d = [r for r in runs if r["rate"] == rate and r["config"] == config]
            if not d or a is None:
                continue
            att, tp = _ci(d, "interactive_attainment"), _ci(d, "batch_tokens_per_s")
            ratio = _mean(tp) / a.mean if a.mean > 0 else math.nan
            out.append(
                f"rate {rate:g}: {config} attainment {_cell(att)}, batch {_cell(tp, 0)} tok/s = "
                f"{ratio:.3f}x (a)'s"
            )
    return out


def _verdicts(
    result: dict[str, Any], runs: list[dict[str, Any]], sweep: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    target = result["target_rate"]
    if target is None:
        out.append(
            {
                "target": "at the rate where (a) < 0.90, (d) >= 0.99 and batch >= 0.9x (a)",
                "verdict": "N/A",
                "detail": "(a) keeps >= 0.90 at every rate of the sweep: add a higher rate",
            }
        )
    else:
        a = [r for r in runs if r["rate"] == target and r["config"] == "a-least-outstanding"]
        a_att, a_tp = _ci(a, "interactive_attainment"), _ci(a, "batch_tokens_per_s")
        for config, label in (
            ("d-berth", "(d)"),
            ("d-chiron-paper", "(d, the paper's rule)"),
            ("e-no-borrow", "(e, no borrowing)"),
            ("f-no-reserve", "(f, borrowing without the reserve)"),
        ):
            d = [r for r in runs if r["rate"] == target and r["config"] == config]
            if not d:
                continue
            d_att, d_tp = _ci(d, "interactive_attainment"), _ci(d, "batch_tokens_per_s")
            ratio = _mean(d_tp) / _mean(a_tp) if _mean(a_tp) > 0 else math.nan
            out.append(
                {
                    "target": f"at rate {target:g} ((a)'s attainment {_cell(a_att)} < 0.90) "
                    f"{label} keeps >= 0.99",
                    "verdict": "PASS" if _mean(d_att) >= 0.99 else "FAIL",
                    "detail": f"{label} {_cell(d_att)}",
                }
            )
            detail = f"{label} {_cell(d_tp, 0)} vs (a) {_cell(a_tp, 0)} tok/s: {ratio:.3f}x"
            out.append(
                {
                    "target": f"at rate {target:g} {label}'s batch throughput >= 0.9x (a)'s",
                    "verdict": "PASS" if ratio >= 0.9 else "FAIL",
                    "detail": detail,
                }
            )
    rate = result["sweep_rate"]
    d = [r for r in runs if r["rate"] == rate and r["config"] == "d-berth"]
    valid = []
    for cap in sorted({r["cap"] for r in sweep}):
        mine = [r for r in sweep if r["cap"] == cap]
        kept, tp = _ci(mine, "itl_kept"), _ci(mine, "batch_tokens_per_s")
        if kept is not None and tp is not None and kept.mean >= 0.99:
            valid.append((tp.mean, cap))
    d_tp, d_kept = _ci(d, "batch_tokens_per_s"), _ci(d, "itl_kept")
    if not valid:
        out.append(
            {
                "target": ADAPTIVE_TARGET,
                "verdict": "N/A",
                "detail": "no static cap of the sweep keeps >= 0.99 of requests within their ITL target: "
                "nothing to hold the adaptive cap against (smaller caps, as --caps 16,32,64,128, give one)",
            }
        )
    else:
        best_tp, best_cap = max(valid)
        ratio = _mean(d_tp) / best_tp if best_tp > 0 else math.nan
        ok = ratio >= 0.9 and _mean(d_kept) >= 0.99
        out.append(
            {
                "target": ADAPTIVE_TARGET,
                "verdict": "PASS" if ok else "FAIL",
                "detail": f"(d) {_cell(d_tp, 0)} tok/s vs static cap {best_cap} {best_tp:.0f} tok/s: "
                f"{ratio:.3f}x; "
                f"(d) ITL kept {_cell(d_kept)}",
            }
        )
    return out


def plot_timeline(runs: Sequence[Run], rate: float, path: Path) -> str | None:
    """Queue, caps per class and interactive attainment over time for (a) and (d) at `rate`, seed 0;
    None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'berth-gateway[plot]')"
    chosen = [
        r for r in runs if r.rate == rate and r.seed == 0 and r.config in ("a-least-outstanding", "d-berth")
    ]
    if not chosen:
        return "no plot: no runs at that rate"
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for r in chosen:
        tl = r.timeline
        t = tl["t_s"]
        axes[0].plot(t, tl["gateway_queued"], label=r.config)
        for cls, caps in tl["caps_by_class"].items():
            axes[1].plot(t, caps, label=f"{r.config} {cls}")
        att = tl["attainment"]
        if att:  # each window's figure held over the window (the last one too)
            xs = [x for x, _ in att] + [att[-1][0] + tl["attainment_window_s"]]
            ys = [y for _, y in att] + [att[-1][1]]
            axes[2].step(xs, ys, where="post", label=r.config)
    axes[0].set_ylabel("queued in berth")
    axes[1].set_ylabel("caps in force (sum per class)")
    axes[2].set_ylabel(f"interactive attainment ({WINDOW_S:g} s windows)")
    axes[2].set_xlabel("simulated s")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"rate {rate:g} interactive/s, seed 0")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
