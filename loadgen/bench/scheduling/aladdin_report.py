"""Aladdin's benchmark report: the markdown tables (fewest endpoints per rate, each seed at the answer,
where the misses come from) and the verdicts against the targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.bench.scheduling.aladdin_probe import BERTH, FLOOR_RATIO_TARGET, GOODPUT_TARGET, JSQ


# --------------------------------------------------------------------- the report
def _cell(v: Any, hi: int) -> str:
    return f"> {hi}" if v is None else str(v)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _at(row: dict[str, Any], policy: str, n: int | None) -> dict[str, Any] | None:
    if n is None:
        return None
    for p in row["probes"].get(policy, []):
        if p["endpoints"] == n:
            found: dict[str, Any] = p
            return found
    return None


def markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    policies = list(cfg["policies"])
    hi = cfg["max_endpoints"]
    rows = doc["rates"]
    out = ["# Aladdin's question: the fewest endpoints for goodput >= 0.95", ""]
    out += ["What the simulator leaves out:", ""] + [f"- {x}" for x in doc["left_out"]] + [""]
    out += [
        "## Setup",
        "",
        f"- workload `{cfg['workload']}`: ShareGPT-shaped lengths, Poisson arrivals, every request with "
        f"TTFT {cfg['slo']['ttft_ms']:g} ms and ATGT {cfg['slo']['atgt_ms']:g} ms (Aladdin's A100 Llama-2 7B "
        "SLOs), sent as x-berth-ttft-ms / x-berth-itl-ms; goodput = requests that met both;",
        f"- one model on `{cfg['profile']}` endpoints; engines FCFS (one SLO for all: nothing for an engine "
        f"to prioritize); berth's cap = the engine's max_num_seqs ({cfg['cap']}); [telemetry.prior] = the "
        "profile's latency model (the operator's profiling step);",
        "- policies: " + ", ".join(f"{p} `{f}`" for p, f in cfg["policies"].items()) + ";",
        f"- each probe: {cfg['duration_sim_s']:g} simulated s of arrivals per seed, seeds {cfg['seeds']}, "
        "requests pooled; galloping + bisection over the endpoint count;",
        f"- rates rise until every policy needs more than {cfg['stop_above']} endpoints (search bound {hi}).",
        "",
        "## Fewest endpoints per rate",
        "",
    ]
    header = ["rate (req/s)", "floor: all / 95 %", *policies]
    if BERTH in policies and JSQ in policies:
        header.append("berth / JSQ")
    table = []
    for row in rows:
        f = row["fewest"]
        cells = [f"{row['rate']:g}", f"{row['floor_all']:.1f} / {row['floor_kept']:.1f}"]
        cells += [_cell(f.get(p), hi) for p in policies]
        if BERTH in policies and JSQ in policies:
            b, j = f.get(BERTH), f.get(JSQ)
            cells.append("-" if b is None or j is None else f"{b / j:.2f}")
        table.append(cells)
    out += _table(header, table)
    out += [
        "",
        "Floor: the fewest endpoints any router could use within the ATGT target (ideal engines at exactly "
        "15 ms per token, constant batches; `slo_floor`), serving every request / giving up the costliest "
        "5 % (which needs each request's output length ahead).",
        "",
        "## Worker-count model N = ceil(k5 · rate + c5), least squares",
        "",
    ]
    mrows = []
    for p in policies:
        m = doc["models"].get(p)
        if m is None:
            mrows.append([p, "-", "-", "-", "-"])
        else:
            mrows.append(
                [p, f"{m['k5']:.4f}", f"{m['c5']:.2f}", str(m["points"]), f"{m['max_residual']:.2f}"]
            )
    out += _table(["policy", "k5 (endpoints per req/s)", "c5", "points", "max |residual|"], mrows)
    out += ["", "## Target", ""]
    out += target_lines(doc)
    out += [
        "",
        "## Stability: goodput per seed at the answer N and at N - 1",
        "",
    ]
    srows = []
    for row in rows:
        for p in policies:
            n = row["fewest"].get(p)
            at, below = _at(row, p, n), _at(row, p, None if n is None else n - 1)
            srows.append([f"{row['rate']:g}", p, _cell(n, hi), _seeds(below), _seeds(at), _flips(at, below)])
    out += _table(["rate", "policy", "N", "seeds at N - 1", "seeds at N", "one seed alone"], srows)
    out += ["", "## At the answer: how each policy misses", ""]
    mrows2 = [
        miss_row(row["rate"], at)
        for row in rows
        for p in policies
        if (at := _at(row, p, row["fewest"].get(p))) is not None
    ]
    out += _table(
        [
            "rate",
            "policy",
            "N",
            "goodput",
            "refused",
            "TTFT miss",
            "ATGT miss",
            "TTFT p95 ms",
            "ATGT p95 ms",
            "busy share",
        ],
        mrows2,
    )
    out += [
        "",
        "Refused: berth answered 429 (slo_infeasible); TTFT miss: served, first token late; ATGT miss: "
        "first token in time, average token time over target (shares of all requests). Busy share: "
        "endpoints running at least one request, sampled every 2 simulated s.",
        "",
        f"{doc['simulations']} simulations, {doc['sim_wall_s']:g} s of simulation; the benchmark took "
        f"{doc['wall_s']:g} s.",
        "",
    ]
    return "\n".join(out)


def _seeds(probe: dict[str, Any] | None) -> str:
    return "-" if probe is None else " ".join(f"{r['goodput']:.3f}" for r in probe["runs"])


def miss_row(rate: float, probe: dict[str, Any]) -> list[str]:
    """One probe's goodput and misses by cause (shares of its requests), p95s and busy share (seed means)."""
    rs: list[dict[str, Any]] = probe["runs"]
    count = sum(r["count"] for r in rs)

    def share(key: str) -> str:
        return f"{sum(r[key] for r in rs) / count:.3f}" if count else "-"

    def mean(key: str, digits: int = 1) -> str:
        vals = [r[key] for r in rs if r[key] is not None]
        return f"{sum(vals) / len(vals):.{digits}f}" if vals else "-"

    return [
        f"{rate:g}",
        probe["policy"],
        str(probe["endpoints"]),
        f"{probe['goodput']:.3f}",
        share("rejected"),
        share("ttft_miss"),
        share("atgt_miss"),
        mean("ttft_p95_ms"),
        mean("atgt_p95_ms"),
        mean("utilization", 3),
    ]


def _flips(at: dict[str, Any] | None, below: dict[str, Any] | None) -> str:
    """Whether a seed alone would have answered differently: one failing at N, or one passing at N - 1."""
    notes = []
    if at is not None and any(r["goodput"] < GOODPUT_TARGET for r in at["runs"]):
        notes.append("N + 1 or more")
    if below is not None and any(r["goodput"] >= GOODPUT_TARGET for r in below["runs"]):
        notes.append("N - 1 or fewer")
    return " / ".join(notes) if notes else "same N"


def floor_verdict(doc: dict[str, Any]) -> dict[str, Any] | None:
    """berth's fewest endpoints over the floor at the highest rate where berth has an answer (with
    least outstanding's beside it); None when berth found none."""
    for row in reversed(doc["rates"]):
        b = row["fewest"].get(BERTH)
        if b is None:
            continue
        floor = row["floor_all"]
        j = row["fewest"].get(JSQ)
        return {
            "rate": row["rate"],
            "floor": floor,
            BERTH: b,
            JSQ: j,
            "berth_ratio": b / floor,
            "jsq_ratio": None if j is None else j / floor,
            "passed": b / floor <= FLOOR_RATIO_TARGET,
        }
    return None


def target_lines(doc: dict[str, Any]) -> list[str]:
    """The target at the highest rate: berth's endpoints within FLOOR_RATIO_TARGET x the floor (least
    outstanding's ratio beside it, and berth's ratio to least outstanding as Aladdin states it)."""
    v = floor_verdict(doc)
    if v is None:
        return ["No rate where berth found an answer: no verdict."]
    jsq = "no answer" if v["jsq_ratio"] is None else f"{v[JSQ]} endpoints, {v['jsq_ratio']:.2f}x the floor"
    lines = [
        f"At {v['rate']:g} req/s the floor (the fewest endpoints any router serving every request within "
        f"the ATGT target could use) is {v['floor']:.1f}; berth needs {v[BERTH]}: {v['berth_ratio']:.2f}x "
        f"the floor (target <= {FLOOR_RATIO_TARGET:g}x): **{'PASS' if v['passed'] else 'FAIL'}**. "
        f"Least outstanding: {jsq}.",
    ]
    ratio = doc.get("ratio")
    if ratio is not None:
        lines += [
            "",
            f"berth / least outstanding at {ratio['rate']:g} req/s: {ratio['ratio']:.2f} (Aladdin reports "
            "0.6 against join-shortest-queue; least outstanding here is already near the floor, so the floor "
            "is the measure).",
        ]
    return lines
