"""The overhead benchmark's standing-queue phase (`--tests queue`): berth deciding with an SLO preset in
front of a full fleet while a queue of `--queue-depth` requests stands, its event loop beside the bare
proxy's under the same client load in the same run.

- The fleet: one engine-simulator process serving `--fleet-count` endpoints of the `fleet-7b` profile
  with `--queue-cap` seats each (the engines' max-num-seqs, 16 as the profile has it; berth's cap the
  same, as the SLO presets ask of an operator), at speed 1. The seats must outnumber the queue: the
  coding-assistant's SLO admission (`slo-feasibility`, counting the queue) refuses a request when more
  requests of its band or a more urgent one wait than run (no running request's end is predicted to
  free a seat for it), so 1,000 requests stand in the queue only in front of more than 1,000 running.
- berth runs `--queue-policy` (`coding-assistant` by default) with the profile as its performance-model
  prior and queue limits far above the phase's (`berth_config`).
- The client keeps `fleet-count x queue-cap + queue-depth` requests open (closed loop): the calls of
  `--queue-workload`'s tasks (`coding:pattern1`) in order, each with the headers the preset needs (task
  type as SLO class, task id, task SLA) as the loadgen runner sends them (`overhead_workload`), and the
  workload's output lengths (`--queue-max-tokens` caps them). The task SLAs are multiplied by
  `--queue-sla-scale` (30 by default: a call that waits its turn behind 1,000 others is still feasible,
  so admission keeps it queued). A refused request is followed by a pause of a second (the preset's
  Retry-After) before that client's next task. With 1,600 seats the fleet finishes about 150-200
  requests a second. Every seat is taken and about `--queue-depth` requests wait in berth's queue; the
  bare proxy passes every request on and the engines queue them (their seats are the same).
- After `--queue-warmup` seconds (the queue fills, the estimates settle) each proxy's lag samples over
  `--queue-duration` seconds are read from `GET /admin/loop-lag`, and berth's scheduler calls from
  `GET /admin/sched-decisions` before and after (`queue_window.decision_window`): per kind of call the
  calls in the window, the bucket bounds of their p50 and p99, how many took over 5 ms, and the longest
  (exact when it took 2 ms or more: the slow calls are kept as they were; else its bucket's bound).
  berth's queue depth is read from `GET /admin/fleet` just before and after the window (outside it: a
  document of every endpoint is work for the loop too).

The targets (the scale issue's): berth's lag p99 <= the bare proxy's + 0.5 ms, and no scheduler call in
the window over 5 ms.
"""

from __future__ import annotations

import argparse
import math
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.overhead.overhead_client import Command
from loadgen.bench.overhead.overhead_lag import mark_lag, read_gc, read_lag
from loadgen.bench.overhead.overhead_procs import (
    CHAT_PATH,
    FLEET_MODEL,
    Client,
    Target,
    describe,
    log,
    start_bare,
    start_proxy_berth,
)
from loadgen.bench.overhead.overhead_report import QUEUE, Check, Measurement, lag_check
from loadgen.bench.overhead.queue_window import (
    ALL,
    DECISION_LIMIT_MS,
    GC,
    LATE_MS,
    OVER,
    OVER_CPU,
    decision_window,
    gc_window,
    late_lag,
    over_limit,
    over_limit_cpu,
)
from loadgen.bench.scheduling.scheduling_setup import policy_file
from loadgen.bench.scheduling.scheduling_types import BASELINES, PRESETS
from loadgen.engine_sim.profiles import get_profile
from loadgen.harness import REPO_ROOT, start_engine_sim

PROFILE: Final = "fleet-7b"
DECISIONS_PATH: Final = "/admin/sched-decisions"
FLEET_PATH: Final = "/admin/fleet"
#: A call over the limit whose CPU time was under this share of its time was mostly the process waiting
#: for a core (the machine's load), not the scheduler's work.
WAITED_SHARE: Final = 0.5
#: The factor on the task SLAs by default: a call that waits its turn behind 1,000 others is still
#: feasible, so SLO admission lets it wait rather than refusing it. `bench decisions` uses it too, so
#: that its submits are the daemon's here (a refusal costs a tenth of a request let wait).
QUEUE_SLA_SCALE: Final = 30.0


def policy_path(name: str, logdir: Path) -> Path:
    """The policy to run: `coding-assistant` as shipped; a baseline (`round-robin`, `power-of-two`,
    `least-outstanding`) or another shipped preset (`default`, `chat-and-batch`, `aladdin`) with the
    coding-assistant's SLO classes, as the scheduling benchmark runs them (the coding workload names its
    task type as the class), written to `logdir`; else a policy file's path."""
    if name == "coding-assistant":
        return REPO_ROOT / "policies" / "coding-assistant.toml"
    if name in (*BASELINES, *PRESETS):
        return policy_file(name, logdir)
    return Path(name)


def berth_config(args: argparse.Namespace, logdir: Path) -> Path:
    """berth's gateway.toml for the phase: the policy, the seats, the profile as prior, long queues, and
    the lag sampling interval (this file replaces the one `lag_sampling` gave: `-c` given last wins)."""
    prof = get_profile(PROFILE)
    lines = [
        "[limits]",
        f"max_queue_per_model = {max(1024, 4 * args.queue_depth)}",
        "max_queue_wait_s = 600.0",
        f"default_endpoint_cap = {args.queue_cap}",
        # A connection for every seat: with fewer (the default 1,024 against 1,600 seats) a dispatched
        # request waits for one, and after connect_timeout_s fails with 502 although its engine is idle.
        "[upstream]",
        f"pool_total = {max(1024, 2 * args.fleet_count * args.queue_cap)}",
        "[telemetry]",
        f"kv_capacity_tokens = {prof.kv_capacity_tokens}",
        *prof.latency.scaled(1.0).prior_toml(),
        "[policy]",
        f"file = {orjson.dumps(str(policy_path(args.queue_policy, logdir).resolve())).decode()}",
    ]
    if args.lag_interval_ms > 0:
        lines += ["[ops]", f"loop_lag_interval_s = {args.lag_interval_ms / 1000.0!r}"]
    path = logdir / "queue-gateway.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def engine_argv(args: argparse.Namespace) -> list[str]:
    return [
        "--count", str(args.fleet_count), "--port", "0", "--profile", PROFILE, "--model", FLEET_MODEL,
        "--max-num-seqs", str(args.queue_cap), "--load-time-s", "0",
    ]  # fmt: skip


def client_command(args: argparse.Namespace, base_url: str, pid: int) -> Command:
    return Command(
        url=base_url + CHAT_PATH,
        concurrency=args.fleet_count * args.queue_cap + args.queue_depth,
        warmup_s=args.queue_warmup,
        duration_s=args.queue_duration,
        stream=False,
        max_tokens=args.queue_max_tokens,
        cpu_pids=(pid,),
        model=FLEET_MODEL,
        workload=args.queue_workload,
        sla_scale=args.queue_sla_scale,
        max_output_tokens=args.queue_max_tokens,
        error_pause_s=1.0,  # a refusal says Retry-After: 1 (the preset's retry_after_s)
        abandon=True,
    )


def _get_json(url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            doc: dict[str, Any] = orjson.loads(resp.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc


def read_decisions(base_url: str, slow_after: int = 1 << 62) -> dict[str, Any] | None:
    """berth's scheduler call times (None: not berth, or not answering); by default without the slow
    calls kept (a mark)."""
    return _get_json(f"{base_url}{DECISIONS_PATH}?slow_after={slow_after}")


def queued(base_url: str) -> int | None:
    """Requests waiting in berth's queue, every model together (None: not berth)."""
    doc = _get_json(base_url + FLEET_PATH)
    if doc is None:
        return None
    return sum(int(m.get("queued_total", 0)) for m in doc.get("models", {}).values())


def measure_queue(
    args: argparse.Namespace,
    logdir: Path,
    layout: dict[str, frozenset[int] | None],
    error_samples: dict[str, list[str]],
) -> list[Measurement]:
    """The bare proxy, then berth, in front of the same simulated fleet under the same client load; a few
    of each one's errors (refusals) go to `error_samples`."""
    sim, urls = start_engine_sim(
        engine_argv(args), logdir / "queue-sim.log", endpoints=args.fleet_count, python=args.python,
        cwd=REPO_ROOT,
    )  # fmt: skip
    conf = berth_config(args, logdir)
    berth_args = argparse.Namespace(**{**vars(args), "berth_args": f"{args.berth_args} -c {conf}".strip()})
    out: list[Measurement] = []
    with sim:
        for config in [c for c in ("bare", "berth") if c in args.configs]:
            if config == "berth":
                proxy, base_url = start_proxy_berth(
                    berth_args, urls, logdir, layout["proxy"], name="berth-queue"
                )
            else:
                proxy, base_url = start_bare(args, urls, logdir, layout["proxy"], name="bare-queue")
            with proxy:
                m, samples = _queue_phase(args, logdir, layout["client"], Target(config, base_url, proxy))
                out.append(m)
                if samples:
                    error_samples.setdefault(f"{QUEUE} {config}", []).extend(samples)
    return out


def _queue_phase(
    args: argparse.Namespace, logdir: Path, client_cpus: frozenset[int] | None, target: Target
) -> tuple[Measurement, list[str]]:
    proxy, base_url = target.proxy, target.base_url
    assert proxy is not None
    client = Client(args.python, logdir, client_cpus)
    cmd = client_command(args, base_url, proxy.pid)
    try:
        client.send(cmd)
        time.sleep(args.queue_warmup)
        depth_before = queued(base_url) if target.config == "berth" else None
        mark, before = mark_lag(base_url), read_decisions(base_url)
        gc_before = read_gc(base_url)
        time.sleep(args.queue_duration)
        reading = None if mark is None else read_lag(base_url, mark.taken)
        after = None if before is None else read_decisions(base_url, before["slow_taken"])
        gc_after = None if gc_before is None else read_gc(base_url, gc_before["taken"])
        depth_after = queued(base_url) if target.config == "berth" else None
        r = client.result()
    finally:
        client.stop()
    lag = () if reading is None else reading.samples_s
    decisions = {} if before is None or after is None else decision_window(before, after)
    if reading is not None and after is not None and ALL in decisions:
        decisions[ALL].update(late_lag(reading, after["slow"]))
        if reading.taken_at:
            decisions[OVER] = over_limit(after["slow"], reading.taken_at[0])
            decisions[OVER_CPU] = over_limit_cpu(after["slow"], reading.taken_at[0])
    if gc_before is not None and gc_after is not None:
        decisions[GC] = gc_window(gc_before, gc_after, reading)
    if depth_before is not None and depth_after is not None:
        decisions.setdefault(ALL, {}).update(
            queued_before=float(depth_before), queued_after=float(depth_after)
        )
    m = Measurement(
        round=0, phase=QUEUE, config=target.config, concurrency=cmd.concurrency,
        max_tokens=cmd.max_tokens, completed=r["completed"], errors=r["errors"], window_s=r["window_s"],
        rps=r["rps"], lat_ms=r["lat_ms"], ttft_ms=r["ttft_ms"], chunks=0,
        proxy_cpu_s=r["cpu_s"][str(proxy.pid)], upstream_cpu_s=None, lag_s=tuple(lag), decisions=decisions,
    )  # fmt: skip
    text = f"queue of {args.queue_depth}, {args.fleet_count} endpoints, {target.config} {describe(m)}"
    every = decisions.get(ALL)
    if every:
        text += f"  decisions {every['calls']:.0f}, longest {every['max_ms']:.2f} ms"
        if "queued_before" in every:
            text += f"  queued {every['queued_before']:.0f} -> {every['queued_after']:.0f}"
    log(text)
    samples: list[str] = r["error_samples"]
    return m, samples


def _of(ms: Sequence[Measurement], config: str) -> Measurement | None:
    return next((m for m in ms if m.phase == QUEUE and m.config == config), None)


def queue_checks(ms: Sequence[Measurement], fleet: int, depth: int) -> list[Check]:
    """The phase's targets when berth ran it: lag p99 against the bare proxy's, the longest decision."""
    berth, bare = _of(ms, "berth"), _of(ms, "bare")
    if berth is None:
        return []
    lag = berth.lag_ms().get("p99")
    bare_lag = None if bare is None else bare.lag_ms().get("p99")
    every = berth.decisions.get(ALL, {})
    return [
        lag_check(f"event-loop lag p99, {fleet} endpoints, queue of {depth}", lag, bare_lag),
        Check(f"longest scheduler call, queue of {depth}", every.get("max_ms"), DECISION_LIMIT_MS, "ms"),
    ]


def queue_lines(ms: Sequence[Measurement], fleet: int, depth: int) -> list[str]:
    """The phase's figures for the report's table: each proxy's lag and load, berth's decisions."""
    shown = [m for c in ("bare", "berth") if (m := _of(ms, c)) is not None]
    if not shown:
        return []
    out = ["", f"standing queue: {fleet} endpoints, every seat taken, {depth} waiting in berth's queue"]
    out.append(f"{'':42}" + "".join(f"{m.config:>11}" for m in shown) + f"{'berth-bare':>12}")
    berth, bare = _of(ms, "berth"), _of(ms, "bare")
    rows: list[tuple[str, str, int]] = [
        ("event-loop lag p50 ms", "p50", 3),
        ("event-loop lag p99 ms", "p99", 3),
        ("event-loop lag max ms", "max", 2),
    ]
    for label, q, digits in rows:
        line = f"{label:42}" + "".join(f"{m.lag_ms().get(q, math.nan):>11.{digits}f}" for m in shown)
        if berth is not None and bare is not None and berth.lag_s and bare.lag_s:
            line += f"{berth.lag_ms()[q] - bare.lag_ms()[q]:>12.{digits}f}"
        out.append(line)
    out.append(f"{'requests/s':42}" + "".join(f"{m.rps:>11.0f}" for m in shown))
    cpu = [
        m.proxy_cpu_s / m.window_s if m.proxy_cpu_s is not None and m.window_s else math.nan for m in shown
    ]
    out.append(f"{'proxy CPU, share of a core':42}" + "".join(f"{c:>11.2f}" for c in cpu))
    out.append(f"{'errors (refused or failed)':42}" + "".join(f"{m.errors:>11}" for m in shown))
    if berth is not None and berth.decisions:
        every = berth.decisions.get(ALL, {})
        if "queued_before" in every:
            before, after = every["queued_before"], every["queued_after"]
            out.append(f"berth's queue before / after the window: {before:.0f} / {after:.0f}")
        if "late_samples" in every:
            kinds = ", ".join(
                f"{k.removeprefix('late_during_')} {v:.0f}"
                for k, v in every.items()
                if k.startswith("late_during_") and k != "late_during_calls"
            )
            out.append(
                f"lag samples >= {LATE_MS:g} ms: {every['late_samples']:.0f}, of which "
                f"{every['late_during_calls']:.0f} waited while a scheduler call of >= 2 ms ran"
                + (f" ({kinds})" if kinds else "")
            )
        out += _gc_lines(berth.decisions.get(GC))
        out += _over_lines(berth.decisions.get(OVER), berth.decisions.get(OVER_CPU) or {})
        out.append("berth's scheduler calls in the window (p50/p99: bucket bounds; longest exact from 2 ms)")
        for name, f in berth.decisions.items():
            if "calls" not in f:
                continue
            out.append(
                f"  {name:10} {f['calls']:>8.0f} calls  p50 <= {f['p50_le_ms']:g} ms  "
                f"p99 <= {f['p99_le_ms']:g} ms  longest {f['max_ms']:.2f} ms  "
                f"over {DECISION_LIMIT_MS:g} ms: {f['over_limit']:.0f}"
            )
    return out


def _over_lines(over: dict[str, float] | None, cpu: dict[str, float]) -> list[str]:
    """The calls over the limit one by one, each with its CPU time when known, and how many of those
    were mostly the process waiting for a core (CPU under `WAITED_SHARE` of the call's time)."""
    if not over:
        return []
    calls = ", ".join(f"{k}: {v:.2f}" + (f" (CPU {cpu[k]:.2f})" if k in cpu else "") for k, v in over.items())
    out = [
        f"calls over {DECISION_LIMIT_MS:g} ms (call@seconds into the window: ms, the thread's CPU ms; "
        f"`berth-loadgen diag slow-calls` profiles them): {calls}"
    ]
    if cpu:
        waited = sum(1 for k, v in cpu.items() if v < WAITED_SHARE * over.get(k, 0.0))
        worked = sum(1 for k, v in cpu.items() if v > DECISION_LIMIT_MS)
        out.append(
            f"of these, CPU under {WAITED_SHARE:.0%} of the time (the process waiting for a core): {waited} "
            f"of {len(cpu)}; CPU itself over {DECISION_LIMIT_MS:g} ms: {worked}; the most CPU: "
            f"{max(cpu.values()):.2f} ms"
        )
    return out


def _gc_lines(gc: dict[str, float] | None) -> list[str]:
    if not gc:
        return []
    gens = "; ".join(
        f"gen{g} {gc[f'gen{g}_count']:.0f} ({gc[f'gen{g}_sum_ms']:.0f} ms, CPU "
        f"{gc.get(f'gen{g}_cpu_ms', math.nan):.0f} ms, longest {gc[f'gen{g}_max_ms']:.1f})"
        for g in range(3)
        if f"gen{g}_count" in gc
    )
    out = [f"berth's garbage collections in the window: {gens}"]
    if "late_during_gc" in gc:
        late = gc["late_during_gc"]
        out.append(f"lag samples >= {LATE_MS:g} ms that waited while a collection of >= 1 ms ran: {late:.0f}")
    return out
