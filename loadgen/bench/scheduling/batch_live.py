"""The Batch API's figure, live: the fleet simulator's run (`loadgen.bench.scheduling.batch_sim`)
confirmed once over HTTP, scaled down to what one small machine carries.

    berth-loadgen bench batch-sim --live --out DIR                      # 1,000 lines, 90 s of chat
    berth-loadgen bench batch-sim --live --lines 600 --duration 60 --speed 2 --out DIR
    berth-loadgen bench batch-sim --out DIR                             # the simulator's (batch_sim.main)

Setting: the simulated run's (the classes benchmark's fleet of 8 `fleet-7b` endpoints, 2 interactive / 4
mixed / 2 batch, 128 seats each, and `policies/chat-and-batch.toml`), as the classes benchmark's live run
builds it (`loadgen.bench.scheduling.classes_live`): the fleet in `berth-engine-sim --fleet` sped up
`--speed` times, berth in `berth serve` with every time divided by the speed. The interactive chat is the
loadgen runner's (what `berth-loadgen run` runs), the simulated run's trace at the classes benchmark's rate,
arrivals and SLOs divided by the speed. The batch goes through the Batch API with the official `openai` SDK
(`files.create`, `batches.create`, `batches.retrieve` polled every `POLL_S`): the simulated run's lines
(ShareGPT lengths, exact output lengths), fed by berth's batch runner with `--in-flight` lines (`[batch]
max_lines_in_flight`) in berth at once.

Three runs, as on the simulator: the chat alone (baseline attainment), chat and batch submitted together
(attainment, the batch's completion time), the batch alone (the fleet's batch capacity C). The allowed
time and the targets are the simulated benchmark's (`batch_sim.verdict`). Every figure is in simulated
seconds (wall seconds x speed). The batch's output tokens over time come from the polled `usage`
(tokens of the lines answered, by the poll that saw them), the chat's from the loadgen report.

Output: DIR/report.json, DIR/report.md, DIR/batch_live.png, and per run DIR/live/RUN/ (fleet.toml,
gateway.toml, policy.toml, berth.log, sim.log, loadgen.json).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import openai
import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import config_or_reason, say
from loadgen.bench.scheduling import batch_sim, classes
from loadgen.bench.scheduling.classes_live import scaled_back
from loadgen.bench.scheduling.classes_live_setup import live_fleet_file, live_gateway_toml, live_policy_text
from loadgen.bench.scheduling.classes_report import summarize
from loadgen.bench.scheduling.live_stack import cpu_validity, live_processes
from loadgen.bench.skeleton import run_bench
from loadgen.report import Report
from loadgen.runner import RunOptions, run_workload
from loadgen.workloads.base import call_prompt

DEFAULT_LINES: Final = 1000
DEFAULT_DURATION_S: Final = 90.0
DEFAULT_SPEED: Final = 1.0
POLL_S: Final = 0.5  # wall seconds between two `batches.retrieve`
#: The batch may run this many times the allowed time (by the simulator's capacity) before it is stopped.
BATCH_TIMEOUT_FACTOR: Final = 4.0
N_ENDPOINTS: Final = sum(n for _, n in classes.FLEET)


@dataclass(frozen=True, slots=True)
class LiveConfig:
    out: Path
    lines: int = DEFAULT_LINES
    rate: float = batch_sim.DEFAULT_RATE
    duration_s: float = DEFAULT_DURATION_S
    in_flight: int = batch_sim.DEFAULT_IN_FLIGHT
    speed: float = DEFAULT_SPEED
    seed: int = 0

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError("--speed must be positive")
        self.sim()  # its checks

    def sim(self) -> batch_sim.Config:
        return batch_sim.Config(self.out, self.lines, self.rate, self.duration_s, self.in_flight, self.seed)


@dataclass(slots=True)
class BatchWatch:
    """What the polls saw of the batch: (simulated s since submission, output tokens, lines ended)."""

    polls: list[tuple[float, int, int]] = field(default_factory=list)
    status: str = ""
    done_s: float | None = None  # when the last line was seen answered
    output_tokens: int = 0
    total: int = 0

    def rate(self, window_s: float) -> list[tuple[float, float]]:
        """Output tokens a second per window of the batch's lines, by the poll that saw them answered."""
        buckets: dict[int, int] = {}
        prev = 0
        for t, tokens, _ in self.polls:
            k = int(t // window_s)
            buckets[k] = buckets.get(k, 0) + tokens - prev
            prev = tokens
        if not buckets:
            return []
        return [(k * window_s, buckets.get(k, 0) / window_s) for k in range(max(buckets) + 1)]


def batch_file(cfg: LiveConfig) -> bytes:
    """The simulated run's batch lines as a Batch API input file (chat lines of exact output lengths)."""
    out = []
    for t in batch_sim.batch_lines(cfg.sim(), 0):
        call = t.calls[0]
        n = call.output_tokens
        body = {
            "model": classes.MODEL,
            "messages": call_prompt(call, t.index).chat_messages(),
            "max_tokens": n,
            "min_tokens": n,
            "ignore_eos": True,
        }
        line = {"custom_id": f"line-{t.index}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        out.append(orjson.dumps(line))
    return b"\n".join(out) + b"\n"


async def watch_batch(base: str, data: bytes, speed: float, timeout_s: float) -> BatchWatch:
    """Upload `data`, create a batch of it and poll it until it ends (or `timeout_s` wall seconds: then
    cancelled)."""
    w = BatchWatch()
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=2) as client:
        t0 = time.monotonic()
        f = await client.files.create(file=("batch.jsonl", data), purpose="batch")
        b = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while True:
            b = await client.batches.retrieve(b.id)
            t = (time.monotonic() - t0) * speed
            counts, usage = b.request_counts, b.usage
            ended = 0 if counts is None else counts.completed + counts.failed
            tokens = 0 if usage is None else usage.output_tokens
            w.polls.append((t, tokens, ended))
            w.total = 0 if counts is None else counts.total
            if w.done_s is None and w.total and ended >= w.total:
                w.done_s = round(t, 1)
            if b.status in ("completed", "failed", "expired", "cancelled"):
                break
            if time.monotonic() - t0 > timeout_s and b.status == "in_progress":
                await client.batches.cancel(b.id)
            await asyncio.sleep(POLL_S)
        w.status = b.status
        w.output_tokens = tokens
    return w


def gateway_text(urls: Sequence[str], port: int, *, policy: Path, cfg: LiveConfig, batch_dir: Path) -> str:
    return live_gateway_toml(urls, port=port, policy=policy, speed=cfg.speed) + (
        f"\n[batch]\ndir = {orjson.dumps(str(batch_dir)).decode()}\nmax_lines_in_flight = {cfg.in_flight}\n"
        f"retry_s = {1.0 / cfg.speed:g}\n"
    )


async def run_one(cfg: LiveConfig, run: str, timeout_s: float) -> dict[str, Any]:
    """One run (`interactive`, `both` or `batch`) over HTTP: its figures in simulated seconds."""
    s = cfg.speed
    d = cfg.out / "live" / run
    d.mkdir(parents=True, exist_ok=True)
    fleet_path = d / "fleet.toml"
    fleet_path.write_text(live_fleet_file(s))
    policy = d / "policy.toml"
    policy.write_text(live_policy_text(classes.BERTH, s))
    tasks = [dataclasses.replace(t, at_s=t.at_s / s) for t in batch_sim.interactive_tasks(cfg.sim())]

    def gateway_for(urls: Sequence[str], port: int) -> str:
        return gateway_text(urls, port, policy=policy, cfg=cfg, batch_dir=d / "batch")

    async with live_processes(d, fleet_path, N_ENDPOINTS, gateway_for) as live:
        t0 = time.monotonic()
        report = Report(data={}, requests=[], tasks=[])
        watch = BatchWatch()
        async with asyncio.TaskGroup() as tg:
            if run != "interactive":
                batch = tg.create_task(watch_batch(live.base, batch_file(cfg), s, timeout_s), name="batch")
            if run != "batch":
                opts = RunOptions(
                    target=live.base,
                    workload="chat-backlog:0",
                    rate=cfg.rate * s,
                    duration_s=cfg.duration_s / s,
                    seed=cfg.seed,
                    models=(classes.MODEL,),
                    slo_scale=1.0 / s,
                    slo_headers=True,
                    request_timeout_s=cfg.duration_s / s + 600.0,
                    watch_pids=live.watch_pids,
                )
                report = await run_workload(opts, schedule=tasks)
        if run != "interactive":
            watch = batch.result()
        wall = time.monotonic() - t0
        runqueue = live.runqueue_shares(wall)
    (d / "loadgen.json").write_bytes(report.to_json())
    scaled = scaled_back(report, s, {})
    figs, _ = summarize(scaled)
    figs["interactive_output_tokens"] = sum(r.tokens or 0 for r in scaled.requests if r.cls == "interactive")
    figs["batch_requests"] = watch.total
    figs["batch_status"] = watch.status
    figs["batch_tokens"] = watch.output_tokens
    figs["backlog_done_s"] = watch.done_s
    figs["batch_finished"] = watch.polls[-1][2] if watch.polls else 0
    figs["batch_tokens_per_s"] = round(watch.output_tokens / watch.done_s, 1) if watch.done_s else 0.0
    figs["wall_s"] = round(wall, 1)
    cpu, valid, notes = cpu_validity(report.data, runqueue)
    figs["cpu"], figs["valid"], figs["notes"] = cpu, valid, notes
    figs["rates"] = {
        "batch": watch.rate(batch_sim.PLOT_WINDOW_S),
        "interactive": batch_sim.output_rate(scaled, "interactive", batch_sim.PLOT_WINDOW_S),
    }
    return figs


def bench(cfg: LiveConfig, log: Callable[[str], None] = say) -> dict[str, Any]:
    cfg.out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, dict[str, Any]] = {}
    # A stopped batch: beyond a generous multiple of the allowed time at the simulator's capacity.
    timeout_s = BATCH_TIMEOUT_FACTOR * (cfg.duration_s + cfg.lines * 300.0 / 2500.0) / cfg.speed + 60.0
    for run in batch_sim.RUNS:
        figs = asyncio.run(run_one(cfg, run, timeout_s))
        figures[run] = figs
        log(
            f"{run:<12} interactive attainment {figs['interactive_attainment']:.4f}  batch "
            f"{figs['batch_finished']}/{figs['batch_requests']} ({figs['batch_status'] or '-'}) done at "
            f"{figs['backlog_done_s']} s  ({figs['wall_s']} s wall{'' if figs['valid'] else ', CPU-starved'})"
        )
    rates = {run: figures[run].pop("rates") for run in batch_sim.RUNS}
    result = batch_sim.verdict(cfg.sim(), figures)
    result["config"]["speed"] = cfg.speed
    result["valid"] = all(f["valid"] for f in figures.values())
    result["rates"] = {run: {c: [list(p) for p in v] for c, v in by.items()} for run, by in rates.items()}
    (cfg.out / "report.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    md = markdown(result)
    (cfg.out / "report.md").write_text(md)
    plotted = batch_sim.plot(rates["both"], cfg.duration_s, cfg.out / "batch_live.png")
    log(md + (f"\nplot: {plotted}" if plotted else "\n(no plot: matplotlib is not installed)"))
    return result


def markdown(result: dict[str, Any]) -> str:
    head = batch_sim.markdown(result).replace("# A ", "# Live: a ", 1)
    notes = [
        f"- {run}: berth {f['cpu']['berth']['cpu_share']} of a core, "
        f"loadgen {f['cpu']['loadgen']['cpu_share']}, engine simulator {f['cpu']['sim']['cpu_share']}; "
        + ("valid" if f["valid"] else "; ".join(f["notes"]))
        for run, f in result["figures"].items()
    ]
    speed = result["config"]["speed"]
    return (
        head
        + f"- engines and berth at speed {speed:g} (times in simulated seconds)\n"
        + "\n".join(notes)
        + "\n"
    )


def passed(result: dict[str, Any]) -> bool:
    return batch_sim.passed(result)


def main(argv: Sequence[str] | None = None) -> int:
    """`berth-loadgen bench batch-sim`: the simulated benchmark (`batch_sim.main`), or with --live this
    module's confirming run (the entry lives here, so that the import goes one way)."""
    ap = argparse.ArgumentParser(prog="berth-loadgen bench batch-sim --live", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--live", action="store_true", help="over HTTP (without it: the fleet simulator)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lines", type=int, default=DEFAULT_LINES)
    ap.add_argument("--rate", type=float, default=batch_sim.DEFAULT_RATE, help="interactive chat requests/s")
    ap.add_argument("--duration", type=float, default=DEFAULT_DURATION_S, help="interactive chat, seconds")
    ap.add_argument(
        "--in-flight", type=int, default=batch_sim.DEFAULT_IN_FLIGHT, help="[batch] max_lines_in_flight"
    )
    ap.add_argument("--speed", type=float, default=DEFAULT_SPEED, help="engines and berth's times sped up")
    ap.add_argument("--seed", type=int, default=0)
    args = list(sys.argv[1:] if argv is None else argv)
    if "--live" not in args:
        return batch_sim.main(args)
    a = ap.parse_args(args)
    cfg = config_or_reason(
        lambda: LiveConfig(a.out, a.lines, a.rate, a.duration, a.in_flight, a.speed, a.seed)
    )
    return run_bench(BENCHMARKS["batch-sim"], cfg, bench, passed=passed)


if __name__ == "__main__":
    sys.exit(main())
