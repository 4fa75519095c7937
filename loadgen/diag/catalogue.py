"""Every diagnostic, registered once: `berth-loadgen diag NAME ARGS...` runs it, `diag --list` shows what
it looks into. A diagnostic measures one cost or finds one stall and prints its figures; it states no
target and gives no verdict (the benchmarks in `loadgen.bench` do). docs/diagnostics.md says what each
one is for."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Diagnostic:
    name: str  # `berth-loadgen diag NAME`
    looks_into: str  # what it measures or finds, one sentence
    module: str  # its module, whose `main(argv)` is the entry


_ALL: Final = (
    Diagnostic(
        "stallwatch",
        "What holds a running server's event loop: stack snapshots of every stall over a threshold.",
        "loadgen.diag.stallwatch",
    ),
    Diagnostic(
        "overhead-profile",
        "Where berth's CPU per request goes (sampled stacks by component), A/B across checkouts.",
        "loadgen.diag.overhead_profile",
    ),
    Diagnostic(
        "overhead-micro",
        "berth's own per-request work without HTTP, piece by piece, A/B across checkouts.",
        "loadgen.diag.overhead_micro",
    ),
    Diagnostic(
        "overhead-hops",
        "Tasks, futures, timers and callbacks per request on the event loop against the bare proxy's.",
        "loadgen.diag.overhead_hops",
    ),
    Diagnostic(
        "refit-steps",
        "How long a refit of the fitted models holds the event loop, whole and in steps.",
        "loadgen.diag.refit_steps",
    ),
    Diagnostic(
        "refit-cadence",
        "What refitting the fitted models at their cadence costs in accuracy and saves in fits and CPU.",
        "loadgen.diag.refit_cadence",
    ),
    Diagnostic(
        "choice-cost",
        "What MaaSO's configuration choice costs its caller at 24 and 48 devices.",
        "loadgen.diag.choice_micro",
    ),
    Diagnostic(
        "prefix-index",
        "What the prefix index costs per request (keys, lookups) and its memory per block.",
        "loadgen.diag.prefix_index",
    ),
    Diagnostic(
        "prefix-misses",
        "Where a prefix benchmark run loses goodput: per class, refused or late, sent to its prefix or not.",
        "loadgen.diag.prefix_misses",
    ),
    Diagnostic(
        "tokenize-cost",
        "What matching a request by its token ids (the precise prefix source) costs per request.",
        "loadgen.diag.tokenize_cost",
    ),
    Diagnostic(
        "batch-feed",
        "What the batch machinery itself costs per line (validation, feeding, the store, the output).",
        "loadgen.diag.batch_feed",
    ),
    Diagnostic(
        "sim-cpu",
        "How much CPU the engine simulator needs per endpoint, and how many one core runs in real time.",
        "loadgen.diag.sim_cpu",
    ),
    Diagnostic(
        "seat-ends",
        "SLO admission's pending loads made one by one against derived as arrays, on the same loads.",
        "loadgen.diag.seat_ends",
    ),
    Diagnostic(
        "submit-parts",
        "Where a submit's CPU time goes with a standing queue: the parts of the submit path, timed in a run.",
        "loadgen.diag.submit_parts",
    ),
    Diagnostic(
        "gc-census",
        "What the live daemon's young collections walk with a standing queue, by type.",
        "loadgen.diag.gc_census",
    ),
    Diagnostic(
        "gc-counts",
        "What the collector schedule's counts of objects cost live, against the collector's free net count.",
        "loadgen.diag.gc_counts",
    ),
    Diagnostic(
        "slow-calls",
        "Which live scheduler calls are slow with a standing queue: their sizes and profiles, one by one.",
        "loadgen.diag.slow_calls_live",
    ),
)


def _by_name() -> Mapping[str, Diagnostic]:
    out: dict[str, Diagnostic] = {}
    for d in _ALL:
        if d.name in out:
            raise ValueError(f"diagnostic {d.name} is registered twice")
        out[d.name] = d
    return out


DIAGNOSTICS: Final = _by_name()


def listing() -> str:
    width = max(len(n) for n in DIAGNOSTICS)
    return "\n".join(f"{d.name:<{width}}  {d.looks_into}" for d in DIAGNOSTICS.values())
