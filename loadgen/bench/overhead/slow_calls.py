"""Which decision calls are the slow ones, and what they do (`bench decisions`' profiling pass).

A profile of a whole run says where the time goes on average; a p99 is made by a few calls that may do
something else entirely (a full placement, loads remade for the whole fleet). So each timed call of the
judged kinds runs under its own profiler, and per kind the calls at or above its 90th percentile are set
against the rest: berth's functions by calls and time per call in each group
(`OUT/slow-calls-PRESET[-backlog].txt`). The calls' profiles added up are the run's profile.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from loadgen.harness import REPO_ROOT

#: The slow calls of a kind: those at or above this percentile of its times.
SLOW_PERCENTILE: Final = 90.0
_Key = tuple[str, int, str]  # (file, line, function) as cProfile names a function


class CallProfiles:
    """Every timed call of `kinds`, each profiled on its own (`timed`)."""

    __slots__ = ("_calls", "_profiles", "kinds")

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = frozenset(kinds)
        self._calls: list[tuple[str, int, dict[_Key, Any]]] = []  # kind, ns, the call's stats
        self._profiles: list[cProfile.Profile] = []

    def timed(self, kind: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
        """`fn(*args)` under a profiler of its own when `kind` is one of `kinds`; (result, ns)."""
        if kind not in self.kinds:
            t0 = time.perf_counter_ns()
            out = fn(*args)
            return out, time.perf_counter_ns() - t0
        prof = cProfile.Profile()
        t0 = time.perf_counter_ns()
        prof.enable()
        out = fn(*args)
        prof.disable()
        ns = time.perf_counter_ns() - t0
        prof.create_stats()
        self._calls.append((kind, ns, prof.stats))  # (set by create_stats)
        self._profiles.append(prof)
        return out, ns

    def whole(self) -> pstats.Stats | None:
        """The profiled calls' profiles added up (None: no call was profiled)."""
        if not self._profiles:
            return None
        stats = pstats.Stats(self._profiles[0])
        for prof in self._profiles[1:]:
            stats.add(prof)
        return stats

    def report(self, short: Callable[[str], str], top: int = 25) -> str:
        """Per kind: its times, then the slow calls' and the other calls' functions of berth (`short`
        names their file; those under `gateway/`) by cumulative time per call."""
        lines: list[str] = []
        for kind in sorted(self.kinds):
            calls = [c for c in self._calls if c[0] == kind]
            if not calls:
                continue
            us = np.asarray([c[1] for c in calls], dtype=np.float64) / 1000.0
            cut = float(np.percentile(us, SLOW_PERCENTILE))
            slow = [c for c, t in zip(calls, us, strict=True) if t >= cut]
            rest = [c for c, t in zip(calls, us, strict=True) if t < cut]
            lines.append(
                f"== {kind}: {len(calls)} calls, µs p50 {np.percentile(us, 50):.0f} p90 {cut:.0f} "
                f"p99 {np.percentile(us, 99):.0f} max {us.max():.0f} (under the profiler)"
            )
            for label, group in ((f"slow (>= p{SLOW_PERCENTILE:g})", slow), ("the rest", rest)):
                if group:
                    lines += _group(label, group, short, top)
            lines.append("")
        return "\n".join(lines)


def _group(
    label: str, group: Sequence[tuple[str, int, dict[_Key, Any]]], short: Callable[[str], str], top: int
) -> list[str]:
    """A group's berth functions by cumulative time per call: calls, own µs, cumulative µs (per call)."""
    total: dict[_Key, list[float]] = {}
    for _, _, stats in group:
        for key, (_cc, calls, own, cum, _callers) in stats.items():
            row = total.setdefault(key, [0.0, 0.0, 0.0])
            row[0] += calls
            row[1] += own
            row[2] += cum
    n = len(group)
    mean_us = sum(c[1] for c in group) / n / 1000.0
    out = [f"-- {label}: {n} calls, {mean_us:.0f} µs each; per call: calls, own µs, cumulative µs"]
    ours = sorted(
        ((k, v) for k, v in total.items() if short(k[0]).startswith("gateway/")), key=lambda kv: -kv[1][2]
    )
    out += [
        f"   {short(k[0])}:{k[1]}({k[2]})  {v[0] / n:.1f}  {v[1] / n * 1e6:.0f}  {v[2] / n * 1e6:.0f}"
        for k, v in ours[:top]
    ]
    return out


def profile_sections(results: Sequence[dict[str, Any]], judged: Sequence[str]) -> list[str]:
    """The report's lines on where each profiled case's time goes (`bench decisions`' profiles)."""
    lines: list[str] = []
    for r in results:
        prof = r.get("profile")
        if not prof:
            continue
        lines += [
            "",
            f"## Where {r['preset']}'s time goes, {r['case']} case "
            f"(each {', '.join(judged)} call under cProfile, {prof['profiled_s']:.1f} s in all; "
            f"{prof['file']}; the slowest tenth of each kind against the rest: {prof['slow_calls']})",
            "",
            "berth's functions by cumulative time (share of the profiled time):",
            "",
            "| function | calls | cumulative s | share |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| `{p['function']}` | {p['calls']} | {p['cumtime_s']:.3f} | {p['cum_share'] * 100:.0f}% |"
            for p in prof["top_cumulative"]
        ]
        lines += ["", "by own time:", "", "| function | calls | own s | share |", "|---|---|---|---|"]
        lines += [
            f"| `{p['function']}` | {p['calls']} | {p['tottime_s']:.3f} | {p['own_share'] * 100:.0f}% |"
            for p in prof["top_tottime"]
        ]
    return lines


def write_profiles(profiles: CallProfiles, out: Path, label: str, top: int = 25) -> dict[str, Any]:
    """The profiled calls written out: the slow calls set against the rest (OUT/slow-calls-LABEL.txt) and
    the functions with the most time of their own and the most cumulative time over every call
    (OUT/profile-LABEL.txt); returns the summary a report shows (the top rows of each)."""
    (out / f"slow-calls-{label}.txt").write_text(profiles.report(short_path))
    buf = io.StringIO()
    whole = profiles.whole()
    raw: dict[Any, Any] = {}
    if whole is not None:
        whole.stream = buf  # type: ignore[attr-defined]  # where pstats prints
        whole.sort_stats("tottime").print_stats(top)
        whole.sort_stats("cumulative").print_stats(top)
        raw = whole.stats  # type: ignore[attr-defined]  # pstats keeps them untyped
    fname = f"profile-{label}.txt"
    (out / fname).write_text(buf.getvalue())
    measured = sum(v[2] for v in raw.values()) or 1.0  # own times add up to the profiled calls

    def row(key: Any, v: Any) -> dict[str, Any]:
        file, line, fn = key
        _cc, calls, tt, ct, _callers = v
        return {
            "function": f"{short_path(file)}:{line}({fn})",
            "calls": calls,
            "tottime_s": round(tt, 3),
            "cumtime_s": round(ct, 3),
            "own_share": round(tt / measured, 3),
            "cum_share": round(ct / measured, 3),
        }

    by_own = sorted(raw.items(), key=lambda kv: -kv[1][2])[:12]
    # berth's own functions by cumulative time: which step of a decision holds the time
    berth = [kv for kv in raw.items() if short_path(kv[0][0]).startswith("gateway/")]
    by_cum = sorted(berth, key=lambda kv: -kv[1][3])[:12]
    return {
        "file": fname,
        "slow_calls": f"slow-calls-{label}.txt",
        "profiled_s": round(measured, 3),
        "top_tottime": [row(k, v) for k, v in by_own],
        "top_cumulative": [row(k, v) for k, v in by_cum],
    }


def short_path(path: str) -> str:
    """`path` from the repository's root (or from site-packages), as reports show it."""
    root = str(REPO_ROOT) + "/"
    return path[len(root) :] if path.startswith(root) else path.rsplit("/site-packages/", 1)[-1]
