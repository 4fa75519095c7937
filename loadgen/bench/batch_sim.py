"""The Batch API's figure on the fleet simulator: a large batch submitted while interactive chat runs.

    python -m loadgen.bench.batch_sim --out DIR                # 20,000 lines at 3 req/s of chat
    python -m loadgen.bench.batch_sim --quick --out DIR        # 600 lines, 60 s (seconds)
    python -m loadgen.bench.batch_sim --lines 20000 --rate 6 --in-flight 64 --out DIR

Setup: the classes benchmark's fleet (8 simulated endpoints of `fleet-7b`: 2 interactive, 4 mixed,
2 batch), its gateway settings and `policies/chat-and-batch.toml` as shipped; interactive chat
(ShareGPT lengths, TTFT 10 s, ATGT 200 ms) arriving as a Poisson process at `--rate` for `--duration`.
The batch is fed as berth's batch runner feeds one (gateway.batch.runner): `--lines` chat lines of
ShareGPT lengths, `--in-flight` of them in the gateway at a time (`[batch] max_lines_in_flight`), the
next unsent line fed as soon as any line ends (`FeederSimulation`), each in the `batch` class with
the window's end as its deadline (`x-berth-deadline-ms`; the simulator's calls carry a fixed SLO, so
each line's deadline is the window from its own send: with a 24 h window it never binds, as on the live
path).

Three runs with the same seed (the same interactive trace, the same lines):
- `interactive`: interactive chat alone, the baseline attainment (TTFT and ATGT met; unfinished missed);
- `both`: the same chat with the batch submitted at t = 0: interactive attainment (target: at most
  0.01 below the baseline) and the batch's completion time (its last line's end);
- `batch`: the batch alone, fed to fill every seat of the fleet (at least 1,024 lines in flight): the
  fleet's batch output throughput C when all of it is spare.
The time the spare capacity allows: while the interactive chat runs, the batch has C − I output tokens
a second (I: the baseline's interactive output tokens a second), afterwards C; the allowed time is when
that reaches the batch's output tokens. Target: the completion time at most 1.1 × the allowed time.
Throughput is counted in output tokens (what decode capacity is spent on; prompts ride along).

Output: DIR/report.json, DIR/report.md, DIR/batch_sim.png (the batch's and the interactive chat's
output tokens per second over time; needs matplotlib, the `plot` extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.classes import BERTH, FLEET, MODEL, fleet_file, gateway_toml, policy_text
from loadgen.bench.classes import ENGINE_SEATS as SEATS
from loadgen.bench.classes_report import summarize
from loadgen.bench.entry import config_or_reason, run_bench, say
from loadgen.engine_sim.fleet import load_fleet_file
from loadgen.fleetsim import SimOptions
from loadgen.fleetsim.sim import Simulation
from loadgen.report import Report
from loadgen.workloads.arrivals import arrival_fn
from loadgen.workloads.base import CallSpec, Slo, TaskSpec
from loadgen.workloads.chat_batch import ChatBacklogWorkload
from loadgen.workloads.sharegpt import sharegpt_output, sharegpt_prompt

DEFAULT_LINES: Final = 20_000
DEFAULT_RATE: Final = 3.0  # the classes benchmark's middle rate
DEFAULT_DURATION_S: Final = 600.0
# Lines in flight: the fleet's seats (8 endpoints x 128), so that the batch can fill every spare seat
# (berth's default `[batch] max_lines_in_flight` of 64 suits a fleet of that many seats; `--in-flight 64`
# shows what it leaves unused here).
FLEET_SEATS: Final = sum(n for _, n in FLEET) * SEATS
DEFAULT_IN_FLIGHT: Final = FLEET_SEATS
WINDOW_S: Final = 24 * 3600.0  # completion_window = "24h"
DRAIN_S: Final = 4 * 3600.0  # a line still running this long after the last arrival is unfinished
SAMPLE_S: Final = 5.0
PLOT_WINDOW_S: Final = 30.0
ATTAINMENT_DROP: Final = 0.01
COMPLETION_FACTOR: Final = 1.1
QUICK: Final = {"lines": 600, "duration_s": 60.0}
RUNS: Final = ("interactive", "both", "batch")


@dataclass(frozen=True, slots=True)
class Config:
    out: Path
    lines: int = DEFAULT_LINES
    rate: float = DEFAULT_RATE
    duration_s: float = DEFAULT_DURATION_S
    in_flight: int = DEFAULT_IN_FLIGHT
    seed: int = 0

    def __post_init__(self) -> None:
        if self.lines < 1 or self.in_flight < 1:
            raise ValueError("--lines and --in-flight must be at least 1")
        if self.rate <= 0 or self.duration_s <= 0:
            raise ValueError("--rate and --duration must be positive")


# --------------------------------------------------------------------- the schedules
def interactive_tasks(cfg: Config) -> list[TaskSpec]:
    """The interactive chat (chat-backlog's, without its backlog), the same for every run of a seed."""
    arrivals = arrival_fn("poisson", random.Random(cfg.seed))
    return ChatBacklogWorkload("0").schedule(cfg.rate, cfg.duration_s, arrivals, random.Random(cfg.seed + 1))


def batch_lines(cfg: Config, first_index: int) -> list[TaskSpec]:
    """The batch's lines, one task each, in file order (the same for every run of a seed)."""
    rng = random.Random(cfg.seed + 2)
    slo = Slo(e2e_ms=WINDOW_S * 1000.0)  # the window's end, as the deadline header
    return [
        TaskSpec(
            first_index + i,
            0.0,
            "batch",
            (
                CallSpec(
                    sharegpt_prompt(rng),
                    sharegpt_output(rng),
                    cls="batch",
                    slo=slo,
                    slo_class="batch",
                    slo_headers=True,
                ),
            ),
        )
        for i in range(cfg.lines)
    ]


def schedule(cfg: Config, run: str) -> tuple[tuple[TaskSpec, ...], list[TaskSpec]]:
    """(what arrives on its own: the interactive chat and the first `in_flight` lines at t = 0, the
    lines fed later as lines finish)."""
    inter = interactive_tasks(cfg) if run != "batch" else []
    lines = batch_lines(cfg, len(inter)) if run != "interactive" else []
    # The batch alone measures the fleet's capacity: fed to fill every seat, whatever `in_flight` is.
    in_flight = max(cfg.in_flight, FLEET_SEATS) if run == "batch" else cfg.in_flight
    first, rest = lines[:in_flight], lines[in_flight:]
    return tuple(sorted([*inter, *first], key=lambda t: (t.at_s, t.index))), rest


class FeederSimulation(Simulation):
    """The fleet simulator with the batch runner's feeder: each batch line that ends (answered or not)
    lets the next unsent line in, so `in_flight` lines are in the gateway until the batch runs out."""

    def __init__(self, opts: SimOptions, pending: list[TaskSpec]) -> None:
        super().__init__(opts)
        self._pending = deque(pending)

    def _task_done(self, task: Any, ok: bool) -> None:
        super()._task_done(task, ok)
        if task.spec.task_type == "batch" and self._pending:
            spec = dataclasses.replace(self._pending.popleft(), at_s=self.clock.t)
            self._open_tasks += 1
            self._arrive(spec)


# --------------------------------------------------------------------- one run
def run_one(cfg: Config, run: str) -> Report:
    d = cfg.out / "runs" / run
    d.mkdir(parents=True, exist_ok=True)
    (d / "fleet.toml").write_text(fleet_file(SEATS))
    (d / "gateway.toml").write_text(gateway_toml())
    (d / "policy.toml").write_text(policy_text(BERTH))
    first, rest = schedule(cfg, run)
    opts = SimOptions(
        policy=d / "policy.toml",
        fleet=tuple(load_fleet_file(d / "fleet.toml")),
        gateway=d / "gateway.toml",
        workload=f"batch-sim:{run}",
        rate=cfg.rate,
        duration_s=cfg.duration_s,
        seed=cfg.seed,
        models=(MODEL,),
        request_timeout_s=DRAIN_S + cfg.duration_s,
        stall_timeout_s=DRAIN_S,
        drain_timeout_s=DRAIN_S,
        sample_every_s=SAMPLE_S,
        schedule=first,
    )
    random.seed(cfg.seed)  # as `simulate` does: nothing should read the global RNG
    return FeederSimulation(opts, rest).run()


def output_rate(report: Report, cls: str, window_s: float) -> list[tuple[float, float]]:
    """(window start, output tokens a second) of the finished requests of `cls`, by finish time."""
    buckets: dict[int, int] = {}
    for r in report.requests:
        if r.cls == cls and r.ok and r.e2e_s is not None:
            k = int((r.sent_at_s + r.e2e_s) // window_s)
            buckets[k] = buckets.get(k, 0) + (r.tokens or 0)
    if not buckets:
        return []
    return [(k * window_s, buckets.get(k, 0) / window_s) for k in range(max(buckets) + 1)]


def allowed_time(batch_tokens: float, capacity: float, interactive: float, duration_s: float) -> float | None:
    """When the spare output capacity (capacity − interactive while the chat runs, capacity after)
    reaches `batch_tokens`; None without capacity."""
    if capacity <= 0:
        return None
    spare = max(0.0, capacity - interactive)
    if spare * duration_s >= batch_tokens:
        return batch_tokens / spare if spare > 0 else None
    return duration_s + (batch_tokens - spare * duration_s) / capacity


# --------------------------------------------------------------------- the benchmark
def bench(cfg: Config, log: Callable[[str], None] = say) -> dict[str, Any]:
    cfg.out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, dict[str, Any]] = {}
    rates: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for run in RUNS:
        t0 = time.perf_counter()
        report = run_one(cfg, run)
        figs, _ = summarize(report)
        inter_tokens = sum(r.tokens or 0 for r in report.requests if r.cls == "interactive")
        figs["interactive_output_tokens"] = inter_tokens
        figs["wall_s"] = round(time.perf_counter() - t0, 1)
        figures[run] = figs
        rates[run] = {c: output_rate(report, c, PLOT_WINDOW_S) for c in ("batch", "interactive")}
        log(
            f"{run:<12} interactive attainment {figs['interactive_attainment']:.4f}  "
            f"batch {figs['batch_finished']}/{figs['batch_requests']} done at {figs['backlog_done_s']} s  "
            f"({figs['wall_s']} s wall)"
        )
    result = verdict(cfg, figures)
    result["rates"] = {run: {c: [list(p) for p in v] for c, v in by.items()} for run, by in rates.items()}
    (cfg.out / "report.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (cfg.out / "report.md").write_text(markdown(result))
    plotted = plot(rates["both"], cfg.duration_s, cfg.out / "batch_sim.png")
    log(markdown(result) + (f"\nplot: {plotted}" if plotted else "\n(no plot: matplotlib is not installed)"))
    return result


def verdict(cfg: Config, figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    base, both, alone = figures["interactive"], figures["both"], figures["batch"]
    capacity = alone["batch_tokens_per_s"]
    interactive = base["interactive_output_tokens"] / cfg.duration_s
    allowed = allowed_time(both["batch_tokens"], capacity, interactive, cfg.duration_s)
    done = both["backlog_done_s"]
    drop = round(base["interactive_attainment"] - both["interactive_attainment"], 4)
    ratio = round(done / allowed, 3) if done is not None and allowed else None
    return {
        "config": {
            "lines": cfg.lines,
            "rate": cfg.rate,
            "duration_s": cfg.duration_s,
            "in_flight": cfg.in_flight,
            "seed": cfg.seed,
        },
        "figures": figures,
        "batch_capacity_tokens_per_s": capacity,
        "interactive_tokens_per_s": round(interactive, 1),
        "allowed_s": None if allowed is None else round(allowed, 1),
        "completion_s": done,
        "completion_ratio": ratio,
        "attainment_drop": drop,
        "targets": {
            f"attainment drop <= {ATTAINMENT_DROP}": drop <= ATTAINMENT_DROP,
            f"completion <= {COMPLETION_FACTOR} x allowed": ratio is not None and ratio <= COMPLETION_FACTOR,
        },
    }


def passed(result: dict[str, Any]) -> bool:
    return all(result["targets"].values())


def markdown(result: dict[str, Any]) -> str:
    c, f = result["config"], result["figures"]
    lines = [
        f"# A {c['lines']}-line batch beside interactive chat at {c['rate']:g} req/s "
        f"({c['duration_s']:g} s, {c['in_flight']} lines in flight, seed {c['seed']})",
        "",
        "| run | interactive attainment | batch lines done | batch done at (s) | batch output tok/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for run in RUNS:
        g = f[run]
        lines.append(
            f"| {run} | {g['interactive_attainment']:.4f} | {g['batch_finished']}/{g['batch_requests']} "
            f"| {g['backlog_done_s']} | {g['batch_tokens_per_s']} |"
        )
    lines += [
        "",
        f"- interactive attainment drop: {result['attainment_drop']:+.4f} (target <= {ATTAINMENT_DROP})",
        f"- fleet batch capacity C = {result['batch_capacity_tokens_per_s']} output tok/s; interactive load "
        f"I = {result['interactive_tokens_per_s']} tok/s",
        f"- the batch finished at {result['completion_s']} s; spare capacity allows {result['allowed_s']} s: "
        f"ratio {result['completion_ratio']} (target <= {COMPLETION_FACTOR})",
        "- targets: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in result["targets"].items()),
    ]
    return "\n".join(lines) + "\n"


def plot(rates: dict[str, list[tuple[float, float]]], duration_s: float, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(9, 4))
    for cls, style in (("interactive", "tab:blue"), ("batch", "tab:orange")):
        pts = rates.get(cls, [])
        ax.step(
            [t for t, _ in pts], [v for _, v in pts], where="post", color=style, label=f"{cls} output tok/s"
        )
    ax.axvline(duration_s, color="grey", linestyle=":", label="interactive chat ends")
    ax.set_xlabel(f"simulated time (s), {PLOT_WINDOW_S:g}-s windows by finish time")
    ax.set_ylabel("output tokens / s")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadgen.bench.batch_sim", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lines", type=int, default=DEFAULT_LINES)
    ap.add_argument("--rate", type=float, default=DEFAULT_RATE, help="interactive chat requests/s")
    ap.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="interactive chat, seconds")
    ap.add_argument("--in-flight", type=int, default=DEFAULT_IN_FLIGHT, help="[batch] max_lines_in_flight")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help=f"a small run: {QUICK}")
    a = ap.parse_args(argv)
    lines, duration = (QUICK["lines"], QUICK["duration_s"]) if a.quick else (a.lines, a.duration)
    cfg = config_or_reason(lambda: Config(a.out, int(lines), a.rate, float(duration), a.in_flight, a.seed))
    return run_bench("batch-sim", cfg, bench, passed=passed)


if __name__ == "__main__":
    sys.exit(main())
