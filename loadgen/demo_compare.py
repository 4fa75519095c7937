"""`berth demo`'s first act: why berth, in seconds, on the offline fleet simulator.

The same simulated fleet and the same trace twice: a plain router (least outstanding, no classes, no
preemption) and berth's `policies/chat-and-batch.toml` as shipped. The setting is the classes
benchmark's (`loadgen.bench.scheduling.classes`, Chiron's): one model on 8 `fleet-7b` endpoints (2
interactive, 4 mixed, 2 batch), interactive chat (TTFT 10 s, ITL 200 ms) arriving at `rate` a second while a
backlog of batch requests (TTFT 1 h, ITL 2 s) waits from the start: the load where a router that only counts
requests lets batch work fill every batch, and interactive streams miss their token-time target.

Each run goes on until the backlog is done (its batch TTFT of an hour is the bound). Prints both side
by side (goodput and TTFT per class, batch throughput, preemptions) and, with matplotlib (the `plot`
extra), writes a PNG of the interactive requests' TTFT and token-time distributions.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loadgen.bench.scheduling import classes
from loadgen.engine_sim.fleet import load_fleet_file
from loadgen.fleetsim import SimOptions, simulate
from loadgen.report import Report

CONFIGS: Final = (("least-outstanding", classes.BASELINE), ("berth chat-and-batch", classes.BERTH))
RATE: Final = 6.0
BACKLOG: Final = 2000
DURATION_S: Final = 45.0


@dataclass(frozen=True, slots=True)
class Side:
    name: str
    report: Report

    def of(self, cls: str) -> list[float]:
        return [r.ttft_s for r in self.report.requests if r.cls == cls and r.ok and r.ttft_s is not None]

    def goodput(self, cls: str) -> float:
        reqs = [r for r in self.report.requests if r.cls == cls]
        return sum(1 for r in reqs if r.slo_met) / len(reqs) if reqs else math.nan

    def count(self, cls: str) -> int:
        return sum(1 for r in self.report.requests if r.cls == cls)

    def finished(self, cls: str) -> int:
        return sum(1 for r in self.report.requests if r.cls == cls and r.ok)

    def atgt(self, cls: str) -> list[float]:
        return [r.atgt_s for r in self.report.requests if r.cls == cls and r.ok and r.atgt_s is not None]

    @property
    def preemptions(self) -> int:
        return int(self.report.data.get("simulation", {}).get("preemptions", 0))


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def run(
    out: Path | None = None,
    *,
    rate: float = RATE,
    backlog: int = BACKLOG,
    duration_s: float = DURATION_S,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[Side]:
    """Both configurations on the same trace; files under `out` (a temporary directory if None)."""
    with tempfile.TemporaryDirectory(prefix="berth-demo-") as tmp:
        base = Path(tmp) if out is None else out
        sides = []
        for name, config in CONFIGS:
            d = base / config
            d.mkdir(parents=True, exist_ok=True)
            (d / "fleet.toml").write_text(classes.fleet_file(classes.ENGINE_SEATS))
            (d / "gateway.toml").write_text(classes.gateway_toml())
            (d / "policy.toml").write_text(classes.policy_text(config))
            opts = SimOptions(
                policy=d / "policy.toml",
                fleet=tuple(load_fleet_file(d / "fleet.toml")),
                gateway=d / "gateway.toml",
                workload=f"chat-backlog:{backlog}",
                rate=rate,
                duration_s=duration_s,
                seed=seed,
                models=(classes.MODEL,),
                request_timeout_s=classes.DRAIN_S + duration_s,
                stall_timeout_s=classes.DRAIN_S,
                drain_timeout_s=classes.DRAIN_S,
            )
            log(f"simulating {name} ...")
            sides.append(Side(name, simulate(opts)))
        return sides


def table(sides: Sequence[Side]) -> str:
    """The two runs side by side, one row per figure."""
    rows: list[tuple[str, Callable[[Side], str]]] = [
        ("interactive goodput (TTFT 10 s, ITL 200 ms)", lambda s: f"{s.goodput('interactive'):.3f}"),
        ("interactive TTFT p50 / p90 (s)", lambda s: _pair(s.of("interactive"))),
        ("interactive token time p90 (ms)", lambda s: f"{1000 * _pct(s.atgt('interactive'), 0.9):.0f}"),
        ("batch goodput (TTFT 1 h, ITL 2 s)", lambda s: f"{s.goodput('batch'):.3f}"),
        ("batch finished", lambda s: f"{s.finished('batch')} of {s.count('batch')}"),
        ("batch TTFT p50 / p90 (s)", lambda s: _pair(s.of("batch"))),
        ("preemptions", lambda s: str(s.preemptions)),
    ]
    width = max(len(r[0]) for r in rows) + 2
    cols = [max(len(s.name), 14) + 2 for s in sides]
    lines = [" " * width + "".join(f"{s.name:>{c}}" for s, c in zip(sides, cols, strict=True))]
    lines += [
        f"{label:<{width}}" + "".join(f"{get(s):>{c}}" for s, c in zip(sides, cols, strict=True))
        for label, get in rows
    ]
    return "\n".join(lines)


def _pair(values: Sequence[float]) -> str:
    return f"{_pct(values, 0.5):.2f} / {_pct(values, 0.9):.2f}"


def plot(sides: Sequence[Side], path: Path) -> str | None:
    """A PNG of the interactive TTFT and token-time CDFs; None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'berth-gateway[plot]')"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for s in sides:
        for ax, values in (
            (axes[0], s.of("interactive")),
            (axes[1], [1000 * v for v in s.atgt("interactive")]),
        ):
            xs = sorted(values)
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=s.name)
    axes[0].axvline(10.0, color="grey", linestyle=":", label="TTFT target")
    axes[0].set(xscale="log", xlabel="interactive TTFT (s)", ylabel="share of requests")
    axes[1].axvline(200.0, color="grey", linestyle=":", label="ITL target")
    axes[1].set(xlabel="interactive average token time (ms)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle("Interactive chat beside a batch backlog, same fleet and trace")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
