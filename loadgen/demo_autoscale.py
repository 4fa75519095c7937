"""`berth demo --autoscale`: the autoscaler on one machine, for real.

A temporary directory holds a `models.toml` with one model served by `berth-engine-sim` (a real process
that answers /health 503 for `LOAD_TIME_S` first, like a loading engine), an `agent.toml` with
`DEVICES` configured devices (one instance each) and the process backend, a `gateway.toml` whose
`[lifecycle]` runs that agent (`python -m gateway.agent -c agent.toml`, a subprocess per command) and a
policy with `[autoscale]` (Chiron's scaler: interactive backpressure kept in a band). berth runs in this
process; the `chat-batch` workload arrives calm, then in a burst, then calm again. The agent starts
engines as the burst comes (visible in `berth top --url ...` while it runs) and drains and stops them as
it goes. The closing table says how many instances were started and stopped, and why (the decisions'
reasons). At the end (after the results, or Ctrl-C when serving on) every engine the agent started is
stopped through the agent, and the temporary directory removed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from gateway.app import Gateway, ServeOptions, build_app
from gateway.config import apply_overrides, load_gateway_config, load_runtime
from gateway.lifecycle.agent_client import AgentCallError
from gateway.lifecycle.autoscaler import DecisionView
from gateway.lifecycle.instances import InstanceState
from gateway.lifecycle.manager import LifecycleManager
from gateway.sched.plugins import default_registry
from loadgen.render import format_report
from loadgen.runner import LiveSnapshot, RunOptions, build_schedule, run_workload
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskSpec

MODEL: Final = "chat-sim"
MARKER_ENV: Final = "BERTH_DEMO_DIR"  # in every demo engine's environment: the demo's directory
DEVICES: Final = 4  # configured devices of the demo's node: at most this many instances
SPEED: Final = 10.0  # the simulated engine runs this many times faster than a GPU; SLOs scaled to match
LOAD_TIME_S: Final = 3.0  # each engine's /health answers 503 this long (real seconds) after it starts
CAP: Final = 4  # concurrency cap per instance (the scaler's seats)
CALM_RATE: Final = 1.0  # requests/s before and after the burst
BURST_RATE: Final = 12.0
#: The workload's phases as shares of the duration: (share, rate).
PHASES: Final = ((0.25, CALM_RATE), (0.35, BURST_RATE), (0.40, CALM_RATE))
MIN_INTERACTIVE: Final = 1  # instances Chiron keeps when the traffic is calm
#: After the workload, at most this long for the fleet to scale back in (it usually takes less).
SETTLE_S: Final = 60.0
AUTOSCALE: Final = f"""
[autoscale]
plugin = "chiron"
params = {{ theta = 0.5, delta = 0.15, seats = {CAP}, min_interactive = {MIN_INTERACTIVE}, max_retire = 1 }}
interval_s = 2
scale_out_cooldown_s = 0
scale_in_cooldown_s = 8
min_instances = 0                 # Chiron keeps min_interactive (1) itself
max_instances = {DEVICES}
"""
POLICY: Final = """name = "demo-autoscale"
description = "Priority bands, instance classes, Chiron's global autoscaler."
[ordering]
plugin = "priority-bands"
params = { within = "arrival" }
[placement]
picker = { plugin = "max-score" }
filters = [{ plugin = "instance-class" }]
[[placement.scorers]]
plugin = "least-outstanding"
weight = 1.0
[slo]
default_class = "interactive"
[[slo.classes]]
name = "interactive"
kind = "interactive"
band = 0
ttft_ms = 10000.0
itl_ms = 200.0
[[slo.classes]]
name = "batch"
kind = "batch"
band = 1
ttft_ms = 3600000.0
itl_ms = 2000.0
"""


@dataclass(frozen=True, slots=True)
class DemoFiles:
    dir: Path
    gateway_toml: Path


def write_files(root: Path, *, engine_python: str = sys.executable) -> DemoFiles:
    """The demo's configuration: models, agent, gateway and policy files under `root`."""
    engine = [
        engine_python,
        "-m",
        "loadgen.engine_sim.cli",
        "--model",
        "{model}",
        "--port",
        "{port}",
        "--profile",
        "fleet-7b",
        "--speed",
        f"{SPEED:g}",
        "--load-time-s",
        f"{LOAD_TIME_S * SPEED:g}",  # the simulator divides it by the speed
    ]
    (root / "models.toml").write_text(
        f'[[models]]\nname = "{MODEL}"\nengine = "vllm"\ncommand = {json.dumps(engine)}\n'
        "memory_gib = 4\nload_timeout_s = 60\n"
        # marks the demo's engines (a test finds what a run left behind by it)
        f"env = {{ {MARKER_ENV} = {json.dumps(str(root))} }}\n"
    )
    devices = "".join(f'[[devices]]\nname = "gpu{i}"\nmemory_gib = 7\n' for i in range(DEVICES))
    (root / "agent.toml").write_text(
        'models = "models.toml"\nstate_dir = "state"\nbackend = "process"\nnvml = false\nheadroom_gib = 1\n'
        "release_wait_s = 0.2\nstop_timeout_s = 5\nport_range = [20000, 29999]\n" + devices
    )
    (root / "policy.toml").write_text(POLICY + AUTOSCALE)
    agent = json.dumps([sys.executable, "-m", "gateway.agent", "-c", str(root / "agent.toml")])
    gateway_toml = root / "gateway.toml"
    gateway_toml.write_text(
        '[policy]\nfile = "policy.toml"\n'
        f"[limits]\ndefault_endpoint_cap = {CAP}\n"
        "[lifecycle]\n"
        'models = "models.toml"\n'
        "load_deadline_s = 60\nchurn_guard_s = 0\ndrain_timeout_s = 10\nrefresh_interval_s = 2\n"
        '[lifecycle.evictor]\nplugin = "lru"\n'
        f'[[nodes]]\nname = "local"\nagent = {agent}\n'
        "[scrape]\ninterval_s = 0.5\n"
    )
    return DemoFiles(root, gateway_toml)


def burst_schedule(duration_s: float, seed: int = 1) -> list[TaskSpec]:
    """`chat-batch` arriving calm, then in a burst, then calm (`PHASES`), as one schedule."""
    workload = get_workload("chat-batch")
    out: list[TaskSpec] = []
    start = 0.0
    for i, (share, rate) in enumerate(PHASES):
        length = duration_s * share
        phase = build_schedule(
            workload, RunOptions(target="-", rate=rate, duration_s=length, seed=seed + i, slo_scale=1 / SPEED)
        )
        out += [dataclasses.replace(t, index=len(out) + j, at_s=start + t.at_s) for j, t in enumerate(phase)]
        start += length
    return out


@dataclass(slots=True)
class Tally:
    """What the autoscaler did, for the closing table."""

    started: dict[str, int] = dataclasses.field(default_factory=dict)  # reason -> instances
    stopped: dict[str, int] = dataclasses.field(default_factory=dict)  # reason -> instances
    refused: int = 0

    def add(self, d: DecisionView) -> None:
        if d.outcome in ("acted", "clipped"):
            if d.action == "scale_out":
                self.started[d.reason] = self.started.get(d.reason, 0) + d.count
            elif d.action == "scale_in":
                self.stopped[d.reason] = self.stopped.get(d.reason, 0) + 1
        elif d.outcome == "refused":
            self.refused += 1


def closing_table(lm: LifecycleManager, decisions: Sequence[DecisionView]) -> str:
    """How many instances were started and stopped, and why (the decisions' reasons)."""
    tally = Tally()
    for d in decisions:
        tally.add(d)
    cold = lm.starts.get("cold_start", 0)
    stops = lm.evictions
    lines = [
        "",
        "AUTOSCALING",
        f"  instances started: {sum(tally.started.values())} by the autoscaler"
        + (f", {cold} on demand (cold start)" if cold else ""),
    ]
    lines += [f"    {n:>3}  {reason}" for reason, n in sorted(tally.started.items(), key=lambda kv: -kv[1])]
    lines.append(
        f"  instances stopped: {sum(stops.values())} ("
        + (", ".join(f"{k} {v}" for k, v in sorted(stops.items())) or "none")
        + ")"
    )
    lines += [f"    {n:>3}  {reason}" for reason, n in sorted(tally.stopped.items(), key=lambda kv: -kv[1])]
    lines.append(f"  decisions refused by the runner's rules (bounds, devices, cool-downs): {tally.refused}")
    h = lm.autoscaler.counters.get(MODEL)
    if h is not None and h.hysteresis is not None:
        lines.append(f"  hysteresis (scaling actions / scale-ups): {h.hysteresis:.2f}")
    return "\n".join(lines)


async def run_demo(
    *,
    duration_s: float,
    port: int,
    serve_after: bool,
    say: Callable[[str], None],
    until_signal: Callable[[], Any],
) -> None:
    root = Path(tempfile.mkdtemp(prefix="berth-demo-autoscale-"))
    try:
        files = write_files(root)
        await _run(
            files, duration_s=duration_s, port=port, serve_after=serve_after, say=say, until=until_signal
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _run(
    files: DemoFiles,
    *,
    duration_s: float,
    port: int,
    serve_after: bool,
    say: Callable[[str], None],
    until: Callable[[], Any],
) -> None:
    registry = default_registry()
    cfg = apply_overrides(load_gateway_config(files.gateway_toml), listen=f"127.0.0.1:{port}")
    runtime = load_runtime(files.gateway_toml, cfg, registry, listen=cfg.server.listen)
    gw = Gateway(
        runtime,
        cfg,
        ServeOptions(config_path=files.gateway_toml, listen=cfg.server.listen),
        registry=registry,
    )
    lm = gw.lifecycle
    assert lm is not None  # the demo's gateway.toml has [lifecycle]
    runner = web.AppRunner(
        build_app(gw), handle_signals=False, handler_cancellation=True, access_log=None, shutdown_timeout=5.0
    )
    await runner.setup()
    base = f"http://127.0.0.1:{port}"
    decisions: list[DecisionView] = []
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        if not await lm.wait_answered(timeout_s=60.0):
            raise RuntimeError("the demo's node agent did not answer")
        say(f"berth: {base} (policy {runtime.policy.name!r}, autoscaler chiron); node agent: {files.dir}")
        say(f"watch it: berth top --url {base}")
        say(f"the autoscaler starts the first instance of {MODEL} (engine load {LOAD_TIME_S:g}s)")
        if not await lm.wait_for(lambda: _count(lm, InstanceState.READY) >= 1, 60.0):
            raise RuntimeError("the first instance did not become ready")
        calm, burst, _ = (share * duration_s for share, _ in PHASES)
        say(
            f"workload: chat-batch, {CALM_RATE:g} req/s for {calm:.0f}s, a burst of {BURST_RATE:g} req/s for "
            f"{burst:.0f}s, then {CALM_RATE:g} req/s (SLOs scaled 1/{SPEED:g})"
        )
        last = [""]

        def tick(snap: LiveSnapshot) -> None:
            decisions.extend(_new(lm, decisions))
            view = _fleet_line(lm)
            if view != last[0] or int(snap.elapsed_s) % 10 == 0:
                done, flying = snap.requests_done, snap.in_flight
                say(f"  {snap.elapsed_s:5.0f}s  done {done:4d}  in flight {flying:3d}  {view}")
                last[0] = view

        report = await run_workload(
            RunOptions(
                target=base,
                workload="chat-batch",
                rate=sum(share * rate for share, rate in PHASES),  # the mean, for the report's header
                duration_s=duration_s,
                models=(MODEL,),
                slo_scale=1 / SPEED,
                drain_timeout_s=60,
            ),
            schedule=burst_schedule(duration_s),
            on_tick=tick,
        )
        print(format_report(report.data), flush=True)
        say(f"burst over: waiting up to {SETTLE_S:g}s for the fleet to scale back in")

        def settled() -> bool:
            decisions.extend(_new(lm, decisions))
            return _count(lm, InstanceState.READY) <= MIN_INTERACTIVE and _busy(lm) == 0

        await lm.wait_for(settled, SETTLE_S)
        say(f"  {_fleet_line(lm)}")
        print(closing_table(lm, decisions), flush=True)
        if serve_after:
            say(f"\nberth keeps serving on {base} (model {MODEL}); Ctrl-C to stop")
            await until()
    finally:
        gw.services.draining = True
        await runner.cleanup()
        await stop_everything(lm, say)
    say("demo stopped")


def _new(lm: LifecycleManager, seen: Sequence[DecisionView]) -> list[DecisionView]:
    """Decisions the autoscaler made since `seen` (its recent list is newest last, bounded)."""
    recent = list(lm.autoscaler.recent)
    last = seen[-1] if seen else None
    if last is None:
        return recent
    for k in range(len(recent) - 1, -1, -1):
        if recent[k] is last:
            return recent[k + 1 :]
    return recent


def _count(lm: LifecycleManager, state: InstanceState) -> int:
    return sum(1 for i in lm.core.instances() if i.state is state)


def _busy(lm: LifecycleManager) -> int:
    """Instances on their way in or out (starting, draining, stopping)."""
    moving = (InstanceState.PENDING, InstanceState.STARTING, InstanceState.DRAINING, InstanceState.STOPPING)
    return sum(1 for i in lm.core.instances() if i.state in moving)


def _fleet_line(lm: LifecycleManager) -> str:
    counts: dict[str, int] = {}
    for i in lm.core.instances():
        if i.state in (InstanceState.STOPPED, InstanceState.FAILED):
            continue
        key = i.state.value if i.state is not InstanceState.READY else f"ready/{i.instance_class.value}"
        counts[key] = counts.get(key, 0) + 1
    insts = " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"
    last = lm.autoscaler.recent[-1] if lm.autoscaler.recent else None
    why = "" if last is None else f"  last: {last.action} {last.outcome} ({last.reason or last.note})"
    return f"instances {insts}{why}"


async def stop_everything(lm: LifecycleManager | None, say: Callable[[str], None]) -> None:
    """Stop every engine the demo's agent runs (its `list`), through the agent."""
    if lm is None:
        return
    for client in lm.clients.values():
        try:
            listed = await client.list_instances()
        except AgentCallError as e:
            say(f"warning: the agent's list failed: {e}")
            continue
        for inst in listed.instances:
            if inst.state in ("starting", "ready"):
                try:
                    await client.stop(inst.id, drain_timeout_s=2.0)
                except AgentCallError as e:
                    say(f"warning: stopping {inst.id} failed: {e}")
