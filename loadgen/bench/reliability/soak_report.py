"""The soak's report: its figures and invariants as markdown (DIR/report.md)."""

from __future__ import annotations

from typing import Any


def render_markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    lines = [
        "# berth fault-matrix soak",
        "",
        f"{doc['requests']['load']} requests (+{doc['requests']['warmup']} warm-up) at concurrency "
        f"{cfg['concurrency']} on {cfg['engines']} simulated engines, seed {cfg['seed']}, "
        f"in {doc['load_s']} s "
        f"({doc['requests_per_s']} requests/s); engines restarted {doc['engine_restarts']} times.",
        "",
        f"**{'PASS' if doc['passed'] else 'FAIL'}**",
        "",
        "## Invariants",
        "",
        "| invariant | result | detail |",
        "| --- | --- | --- |",
    ]
    for name, inv in doc["invariants"].items():
        detail = str(inv["detail"]).replace("|", "/")
        lines.append(f"| {name} | {'pass' if inv['pass'] else '**FAIL**'} | {detail} |")
    lines += ["", "## Faults injected", "", "| kind | count |", "| --- | ---: |"]
    lines += [f"| {k} | {n} |" for k, n in doc["faults_injected"].items()]
    lines += ["", "## Outcomes", "", "| outcome | requests |", "| --- | ---: |"]
    lines += [f"| {k} | {n} |" for k, n in doc["outcomes"].items()]
    rss = doc["rss_kib"]
    lines += [
        "",
        "## Memory",
        "",
        f"VmRSS start {rss['start_kib']} KiB, middle {rss.get('middle_kib')} KiB, end {rss['end_kib']} KiB: "
        f"{rss['kib_per_1k_requests']} KiB per 1,000 requests over the load.",
        "",
    ]
    return "\n".join(lines)
