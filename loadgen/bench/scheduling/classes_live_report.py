"""The classes benchmark's live report: where live and the simulator agree (`TOLERANCES`), the
targets on each path, the verdict, and the markdown.
"""

from __future__ import annotations

import math
from typing import Any, Final

from loadgen.bench.scheduling import classes
from loadgen.bench.scheduling.classes_live_setup import LiveRun
from loadgen.bench.scheduling.classes_report import Run

#: How far live may be from the simulator for a figure to agree: absolute for attainment and the ITL
#: share (one interactive request of the default run's ~50 is 0.02), relative for the rest.
TOLERANCES: Final = {
    "interactive_attainment": ("abs", 0.05),
    "itl_kept": ("abs", 0.02),
    "batch_tokens_per_s": ("rel", 0.10),
    "backlog_done_s": ("rel", 0.10),
}


# --------------------------------------------------------------------- the comparison
def agreement(sim: dict[str, Any], live: dict[str, Any]) -> list[dict[str, Any]]:
    """Per figure of `TOLERANCES`: both values, the difference and whether it is within tolerance."""
    out = []
    for key, (kind, tol) in TOLERANCES.items():
        a, b = sim.get(key), live.get(key)
        if a is None or b is None:
            out.append({"figure": key, "sim": a, "live": b, "diff": None, "agrees": a is None and b is None})
            continue
        diff = b - a if kind == "abs" else ((b - a) / a if a else math.inf)
        out.append({"figure": key, "sim": a, "live": b, "diff": round(diff, 4), "agrees": abs(diff) <= tol})
    return out


def targets(by_config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets at this rate on one path's figures: (d) keeps >= 0.99; (d)'s batch >= 0.9 x (a)'s."""
    a, d = by_config.get(classes.BASELINE), by_config.get(classes.BERTH)
    if a is None or d is None:
        return {}
    ratio = d["batch_tokens_per_s"] / a["batch_tokens_per_s"] if a["batch_tokens_per_s"] else math.nan
    return {
        "d_attainment": d["interactive_attainment"],
        "d_attainment_pass": d["interactive_attainment"] >= 0.99,
        "batch_ratio": round(ratio, 4),
        "batch_ratio_pass": ratio >= 0.9,
    }


def verdict(result: dict[str, Any]) -> tuple[str, list[str]]:
    """Whether live confirms the simulator, and why not."""
    why: list[str] = []
    invalid = [r["config"] for r in result["live"] if not r["valid"]]
    if invalid:
        why.append(f"live run(s) not valid (CPU-starved): {', '.join(invalid)}")
    ts, tl = result["targets"]["sim"], result["targets"]["live"]
    for key in ("d_attainment_pass", "batch_ratio_pass"):
        if key in ts and ts[key] != tl.get(key):
            why.append(f"target verdict {key} differs: sim {ts[key]}, live {tl.get(key)}")
    for config, rows in result["agreement"].items():
        why += [
            f"{config} {row['figure']}: sim {row['sim']}, live {row['live']} (diff {row['diff']})"
            for row in rows
            if not row["agrees"]
        ]
    if invalid:
        if len(why) == 1:
            why.append("otherwise the figures agree within the tolerances and so do the targets' verdicts")
        return "NOT JUDGED", why
    return ("CONFIRMS" if not why else "DIFFERS"), why


def _live_json(r: LiveRun) -> dict[str, Any]:
    return {
        "config": r.run.config,
        "rate": r.run.rate,
        "seed": r.run.seed,
        "wall_s": round(r.wall_s, 1),
        "cpu": r.cpu,
        "valid": r.valid,
        "notes": r.notes,
        **r.run.figures,
        "timeline": r.run.timeline,
    }


def _sim_json(r: Run) -> dict[str, Any]:
    return {"config": r.config, "rate": r.rate, "seed": r.seed, "wall_s": round(r.wall_s, 1), **r.figures}


ROWS: Final = (
    ("interactive attainment", "interactive_attainment", "{:.3f}"),
    ("ITL kept (all)", "itl_kept", "{:.4f}"),
    ("batch tok/s", "batch_tokens_per_s", "{:.0f}"),
    ("backlog done (s)", "backlog_done_s", "{:.0f}"),
    ("batch finished", "batch_finished", "{}"),
    ("unfinished", "unfinished", "{}"),
    ("preemptions", "preemptions", "{}"),
    ("resumes", "resumes", "{}"),
    ("recomputed tokens", "recomputed_tokens", "{}"),
)


def _fmt(fmt: str, v: Any) -> str:
    return "n/a" if v is None else fmt.format(v)


def markdown(result: dict[str, Any]) -> str:
    s = result["setup"]
    sims = {r["config"]: r for r in result["sim"]}
    lives = {r["config"]: r for r in result["live"]}
    configs = [c for c in s["configs"] if c in sims or c in lives]
    lines = [
        "# Instance classes: the confirming live run (simulator beside live)",
        "",
        f"Chiron's setting ({s['fleet']}, one model, `{s['profile']}`): interactive chat at {s['rate']:g} "
        f"req/s for {s['duration_s']:g} s and {s['backlog']} batch requests queued at t = 0, seed "
        f"{s['seed']}. Live: `berth serve` and `berth-engine-sim --fleet` as processes over loopback, the "
        f"engines sped up x{s['speed']:g}, every SLO and time in berth's settings divided by it, every "
        "figure below scaled back to simulated seconds. The simulator ran the same files at speed 1.",
        "",
        "| figure | " + " | ".join(f"{c} sim | {c} live" for c in configs) + " |",
        "| --- | " + " | ".join("--- | ---" for _ in configs) + " |",
    ]
    for label, key, fmt in ROWS:
        cells = []
        for c in configs:
            cells += [_fmt(fmt, sims.get(c, {}).get(key)), _fmt(fmt, lives.get(c, {}).get(key))]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    ts, tl = result["targets"]["sim"], result["targets"]["live"]
    if ts and tl:
        lines += [
            "",
            "| target at this rate | sim | live |",
            "| --- | --- | --- |",
            f"| (d) interactive attainment >= 0.99 | {ts['d_attainment']:.3f} "
            f"{_pf(ts['d_attainment_pass'])} | {tl['d_attainment']:.3f} {_pf(tl['d_attainment_pass'])} |",
            f"| (d) batch tok/s >= 0.9x (a)'s | {ts['batch_ratio']:.3f}x {_pf(ts['batch_ratio_pass'])} | "
            f"{tl['batch_ratio']:.3f}x {_pf(tl['batch_ratio_pass'])} |",
        ]
    lines += ["", "## Validity (live)", ""]
    lines += [
        "| configuration | berth CPU | loadgen CPU | engine sim CPU | waited for a CPU (berth / loadgen) "
        "| wall s | valid |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in configs:
        r = lives.get(c)
        if r is None:
            continue
        cpu = r["cpu"]
        lines.append(
            f"| {c} | {_share(cpu['berth']['cpu_share'])} | {_share(cpu['loadgen']['cpu_share'])} | "
            f"{_share(cpu['sim']['cpu_share'])} | {cpu['berth']['runqueue_share'] * 100:.1f} % / "
            f"{cpu['loadgen']['runqueue_share'] * 100:.1f} % | {r['wall_s']:.0f} | "
            f"{'yes' if r['valid'] else 'NO: ' + '; '.join(r['notes'])} |"
        )
    v = result["verdict"]
    lines += ["", f"**Verdict: {v['verdict']}**" + (": " + "; ".join(v["why"]) if v["why"] else ""), ""]
    tol = ", ".join(
        f"{k} ±{t:g}" if kind == "abs" else f"{k} ±{t * 100:g} %" for k, (kind, t) in TOLERANCES.items()
    )
    lines += [
        "Live confirms the simulator when both live runs are valid, the targets' verdicts agree, and each "
        f"figure agrees within: {tol}.",
        "",
        "Counted differently: berth counts a resume per preempted request that finished and, as recomputed, "
        "the tokens the client had at each preemption; the simulator counts a resume per re-dispatch of a "
        "preempted request and, as recomputed, its prompt plus those tokens. Live errors by kind: "
        + ", ".join(f"{c} {lives[c].get('errors') or {}}" for c in configs if c in lives)
        + "; berth's rejections: "
        + ", ".join(f"{c} {lives[c].get('berth_rejections')}" for c in configs if c in lives)
        + ".",
        "",
    ]
    return "\n".join(lines)


def _pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _share(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.0f} %"
