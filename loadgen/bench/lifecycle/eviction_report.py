"""The eviction benchmark's verdict and report, apart from any run: CACE's and the variants' ratios to
LRU, the share of the LRU-to-bound gap each closes, the targets (`judge`) and the markdown report
(`render_md`). The runs themselves are `loadgen.bench.lifecycle.eviction`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loadgen.bench.lifecycle.eviction_stats import BOOTSTRAP, LOWER_BETTER, ratio

ORACLE = "belady"  # the clairvoyant bound (`eviction_oracle`), shown beside the evictors


def _ratio(a: float | None, b: float | None) -> float | None:
    q = ratio(a, b)
    return None if q is None else round(q, 3)


#: CACE's reported −55 % evictions and −70 % mean TTFT, shown beside each pattern's ratios (information).
EVICTIONS_RATIO_TARGET = 0.45
TTFT_RATIO_TARGET = 0.5
#: The target: the share of the LRU→bound gap closed, in evictions and in mean TTFT, on >= 2 patterns.
GAP_CLOSED_TARGET = 0.5
#: "Not worse than LRU" is judged on these figures (means and totals); the P99s are shown only.
MEAN_FIGURES = ("evictions", "hit_rate", "load_seconds", "ttft_mean_ms", "e2e_mean_ms")

#: Ratio intervals per pattern, row and figure (`eviction_stats.RatioCI.document()`), over lru's.
Cis = dict[str, dict[str, dict[str, dict[str, Any]]]]


def judge(results: dict[str, dict[str, dict[str, Any]]], cis: Cis) -> dict[str, Any]:
    """Targets: cace closes >= GAP_CLOSED_TARGET of the LRU→oracle gap in evictions and in mean TTFT on
    >= 2 patterns (needs the oracle's run); no mean figure worse anywhere, "worse" when the paired
    bootstrap interval of cace ÷ lru lies above 1 (below for the hit rate). The ratios to LRU and the
    oracle's ratios are given beside them."""
    per_pattern: dict[str, Any] = {}
    strong = oracle_strong = closing = 0
    never_worse = True
    for pattern, by in results.items():
        lru, cace = by["lru"], by["cace"]
        ev = _ratio(cace["evictions"], lru["evictions"])
        tt = _ratio(cace["ttft_mean_ms"], lru["ttft_mean_ms"])
        worse = [k for k, c in cis[pattern]["cace"].items() if c["verdict"] == "worse" and k in MEAN_FIGURES]
        meets = ev is not None and tt is not None and ev <= EVICTIONS_RATIO_TARGET and tt <= TTFT_RATIO_TARGET
        strong += meets
        never_worse = never_worse and not worse
        per_pattern[pattern] = {
            "evictions_ratio": ev,
            "ttft_mean_ratio": tt,
            "meets_ratios": meets,
            "worse_on": worse,
            "better_on": [k for k, c in cis[pattern]["cace"].items() if c["verdict"] == "better"],
        }
        oracle = by.get(ORACLE)
        if oracle is not None:
            oev = _ratio(oracle["evictions"], lru["evictions"])
            ott = _ratio(oracle["ttft_mean_ms"], lru["ttft_mean_ms"])
            omeets = (
                oev is not None
                and ott is not None
                and oev <= EVICTIONS_RATIO_TARGET
                and ott <= TTFT_RATIO_TARGET
            )
            oracle_strong += omeets
            per_pattern[pattern].update(
                oracle_evictions_ratio=oev,
                oracle_ttft_mean_ratio=ott,
                oracle_meets_ratios=omeets,
                # How much of the gap from LRU to the oracle each evictor closes (1: all of it).
                gap_closed={
                    row: {
                        "evictions": _gap_closed(f["evictions"], lru["evictions"], oracle["evictions"]),
                        "ttft_mean": _gap_closed(
                            f["ttft_mean_ms"], lru["ttft_mean_ms"], oracle["ttft_mean_ms"]
                        ),
                    }
                    for row, f in by.items()
                    if row not in ("lru", ORACLE)
                },
            )
            closed = per_pattern[pattern]["gap_closed"].get("cace", {})
            half = all(
                (g := closed.get(k)) is not None and g >= GAP_CLOSED_TARGET
                for k in ("evictions", "ttft_mean")
            )
            per_pattern[pattern]["closes_half_the_gap"] = half
            closing += half
    has_oracle = any(ORACLE in by for by in results.values())
    out: dict[str, Any] = {
        "patterns": per_pattern,
        "ratios_on_two_patterns": strong >= 2,
        "gap_closed_on_two_patterns": closing >= 2 if has_oracle else None,
        "never_worse": never_worse,
        "pass": has_oracle and closing >= 2 and never_worse,
    }
    if has_oracle:
        out["oracle_ratios_on_two_patterns"] = oracle_strong >= 2
    return out


def _gap_closed(x: float | None, lru: float | None, oracle: float | None) -> float | None:
    if x is None or lru is None or oracle is None or lru <= oracle:
        return None
    return round((lru - x) / (lru - oracle), 3)


def _pct(part: int, whole: int) -> str:
    return f"{part} of {whole} ({100.0 * part / whole:.0f} %)" if whole else f"{part} of 0"


def render_md(doc: dict[str, Any], variants: Mapping[str, tuple[str, dict[str, Any]]]) -> str:
    """The markdown report; `variants` describes the rows shown beside cace (label -> plugin, parameters)."""
    cfg = doc["config"]
    st = cfg["setting"]
    lines = [
        "# Eviction: CACE vs LRU (fleet simulator), with Belady's clairvoyant bound",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"Setting: {st['devices']} devices × {st['device_gib']:g} GiB; 8 completion models "
        f"({st['small_gib']:g} GiB, load {st['small_load_s']:g} s) and 8 reasoning models "
        f"({st['large_gib']:g} GiB, load {st['large_load_s']:g} s); churn guard {st['churn_guard_s']:g} s. "
        f"Poisson {cfg['rate']:g} req/s for {cfg['duration_s']:g} s, seeds {cfg['seeds']}, pooled. "
        f"CACE params: {cfg['cace_params'] or 'defaults'}. "
        + "".join(f"`{v}`: {variants[v][0]} with {variants[v][1]}. " for v in cfg["variants"])
        + f"`{ORACLE}` evicts the model whose next request comes last, reading the run's own trace: no "
        "online evictor can do that; it bounds what any evictor could gain here.",
        "",
        "Ratios are over lru's on the same seeds, pooled, with the 95 % interval of a paired bootstrap "
        f"over the seeds ({BOOTSTRAP} resamples); a figure is called worse (or better) only when the "
        "interval lies wholly on that side of 1.",
        "",
    ]
    keys = ["requests", "errors", "evictions", "loads", "load_seconds", "hit_rate", *LOWER_BETTER[3:]]
    for pattern, by in doc["results"].items():
        j = doc["verdict"]["patterns"][pattern]
        others = [r for r in by if r != "lru"]
        head = (
            "| figure | " + " | ".join(by) + " | " + " | ".join(f"{r}/lru [95 % CI]" for r in others) + " |"
        )
        lines += [f"## {pattern}", "", head, "| --- |" + " ---: |" * (head.count("|") - 2)]
        for k in keys:
            row = f"| {k} | " + " | ".join(str(by[r][k]) for r in by) + " |"
            for r in others:
                c = doc["cis"][pattern][r].get(k)
                if c is None:
                    row += " |"
                    continue
                lo, hi = c["ci95"]
                mark = {"worse": " **worse**", "better": " better"}.get(c["verdict"], "")
                ci = "" if lo is None else f" [{lo}, {hi}]"
                row += f" {c['ratio']}{ci}{mark} |"
            lines.append(row)
        lines += [
            "",
            f"cace: evictions ratio {j['evictions_ratio']}, mean TTFT ratio {j['ttft_mean_ratio']}; "
            f"worse than LRU on: {', '.join(j['worse_on']) or 'nothing'}; better on: "
            f"{', '.join(j['better_on']) or 'nothing'}",
        ]
        if ORACLE in by:
            gaps = "; ".join(
                f"{r}: evictions {g['evictions']}, mean TTFT {g['ttft_mean']}"
                for r, g in j["gap_closed"].items()
            )
            lines.append(
                f"{ORACLE}: evictions ratio {j['oracle_evictions_ratio']}, mean TTFT ratio "
                f"{j['oracle_ttft_mean_ratio']}; share of the LRU→{ORACLE} gap closed: {gaps}"
            )
        for name in by:
            f = by[name]
            other = ", ".join(f"{o} {_pct(n, f['plans'])}" for o, n in f["differs"].items())
            lines.append(
                f"- {name}: evictions with a choice (more than one instance evictable) "
                f"{_pct(f['with_choice'], f['plans'])}; evictable instances whose next request was "
                f"known or predicted {_pct(f['demand_known'], f['candidates'])} (queued: "
                f"{_pct(f['demand_queued'], f['candidates'])}); other victims on the "
                f"same state by {other or '-'}"
            )
        lines.append("")
    v = doc["verdict"]
    gap = v.get("gap_closed_on_two_patterns")
    lines += [
        "## Targets",
        "",
        f"- cace closes ≥ {GAP_CLOSED_TARGET:.0%} of the LRU→{ORACLE} gap in evictions and in mean TTFT on "
        f"≥ 2 patterns: {'N/A (no oracle run)' if gap is None else 'PASS' if gap else 'FAIL'}",
        f"- no pattern worse than LRU on a mean figure ({', '.join(MEAN_FIGURES)}; 95 % interval above 1): "
        f"{'PASS' if v['never_worse'] else 'FAIL'}",
        f"- (information) CACE's paper ratios, evictions ≤ {EVICTIONS_RATIO_TARGET}× and mean TTFT ≤ "
        f"{TTFT_RATIO_TARGET}× LRU's on ≥ 2 patterns: {'yes' if v['ratios_on_two_patterns'] else 'no'}",
    ]
    if "oracle_ratios_on_two_patterns" in v:
        lines.append(
            f"- (bound) {ORACLE} meets the ratios on ≥ 2 patterns: "
            f"{'yes' if v['oracle_ratios_on_two_patterns'] else 'no: no evictor can, in this setting'}"
        )
    lines.append("")
    return "\n".join(lines)


def ci_text(c: dict[str, Any]) -> str:
    lo, hi = c["ci95"]
    mark = {"worse": " WORSE", "better": " better"}.get(c["verdict"], "")
    return f"{c['ratio']}" + ("" if lo is None else f" [{lo}, {hi}]") + mark
