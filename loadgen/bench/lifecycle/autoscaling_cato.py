"""CATO's setting of the autoscaling benchmark (papers/ALGORITHMS.md §1), in the fleet simulator.

Two code models (`code-a`, `code-b`; profile `fleet-7b`, 16 seats, one device per instance, 30 s to
load) on 12 devices (2 nodes × 6), 1 to 6 instances per model, 2 ready per model at t = 0. The `coding`
workload (pattern1: 40 % completion, 40 % generation, 10 % translation, 10 % summarization; two-call
tasks use both models) arrives as a Poisson process with bursts at 3× the rate. Routing is
power-of-two choices over outstanding requests for every configuration (the Ray Serve baseline's
router), with the SLO classes and task allotments of `policies/coding-assistant.toml`; the
configurations differ in the autoscaler (`[autoscale]`, interval 2 s):

- `cato-sla`: slack violations (a call over its own share of its task SLA by 20 %) past 3 and past the
  idle instances add instances; instances idle for 20 s are removed; a call still queued or running
  that is already over the limit counts at once (berth's reading);
- `cato-sla-finished`: the same, counting a call only when it finishes (the paper's literal rule);
- `queue-length`: Ray Serve's defaults (2 ongoing requests per instance, 30 s upscale delay, 600 s
  downscale delay); `queue-length-target1`: the same with 1 ongoing request per instance (Ray Serve's
  default before 2.32, when CATO was measured against it);
- `aladdin-workers`: instances = ceil(k5 · arrival rate + c5), fitted online;
- `cato-sla+slack-routing`: cato-sla with CATO's own scheduling (slack ordering, the `cato-slack`
  replica choice) instead of power-of-two: CATO's scaling rule leaves violations to idle replicas, which
  a slack-aware router uses and power-of-two may not;
- `cato-sla-idle10s`, `cato-sla-idle60s`: cato-sla with another idle timeout (`IDLE_TIMEOUT_S`: 20 s).

Figures per run: task goodput (tasks that met their task SLA; failed ones missed), request SLO
attainment, mean utilization (CATO's: the share of instances running at least one request, sampled every
2 s; instances still loading are not counted), device utilization (busy device-seconds over the
device-seconds held, loading instances included, same samples), device-hours, peak devices, scale-ups,
scaling actions and hysteresis.

Targets: CATO reports utilization +41 % over Ray Serve (0.48 vs 0.34) with goodput up to +10 %. A
utilization ratio rewards a scaler for holding fewer idle instances whatever it costs the SLA, and it is
bounded by 1 / the baseline's utilization; what an operator pays for is devices. So the target is
cato-sla's device-hours ≤ 0.8× queue-length's with its task goodput within 0.01 of it (both on the means
over seeds); the utilization ratio is shown beside them.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.core.types import InstanceClass, ModelName
from gateway.lifecycle.instances import DeviceSpec, LifecycleSettings, ModelSpec, NodeSpec
from loadgen.bench.lifecycle.autoscaling_common import (
    Burst,
    SettingResult,
    Target,
    attainment,
    bursty_arrivals,
    md_table,
    mean_of,
    pooled_rows,
    run_configs,
    scaling_figures,
    task_goodput,
)
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.lifecycle import InitialInstances, LifecycleOptions
from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.sim import simulate
from loadgen.harness import REPO_ROOT
from loadgen.report import Report
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.coding import CodingWorkload

MODELS: Final = (ModelName("code-a"), ModelName("code-b"))
PROFILE: Final = "fleet-7b"
GIB: Final = 1 << 30
CODING_PRESET: Final = REPO_ROOT / "policies" / "coding-assistant.toml"
#: cato-sla's idle timeout here. Power-of-two routing spreads the work, so an instance rarely stays idle
#: long: at 60 s cato-sla kept almost every instance it started (seeds 0-4: utilization 0.578, 2.59
#: device-hours), at 20 s it retires them between bursts (0.675, 2.19), at 10 s further (0.737, 1.92) but
#: it thrashes (hysteresis 1.71 against 1.45) and request attainment falls (0.897 against 0.928); task
#: goodput is 0.913-0.914 throughout. The `-idle10s` and `-idle60s` rows keep that sweep in the report.
IDLE_TIMEOUT_S: Final = 20.0


def cato_sla(idle_timeout_s: float = IDLE_TIMEOUT_S, *, in_flight: bool = True) -> str:
    return (
        'plugin = "cato-sla"\n'
        "params = { max_exceeded_proportion = 0.2, max_exceeded_times = 3, "
        f"idle_timeout_s = {idle_timeout_s:g}, count_in_flight = {str(in_flight).lower()} }}"
    )


def queue_length(target: float) -> str:
    return (
        'plugin = "queue-length"\n'
        f"params = {{ target_per_instance = {target:g}, upscale_delay_s = 30.0, downscale_delay_s = 600.0 }}"
    )


AUTOSCALE: Final = {
    "cato-sla": cato_sla(),
    "cato-sla-finished": cato_sla(in_flight=False),
    "queue-length": queue_length(2.0),
    "queue-length-target1": queue_length(1.0),
    "aladdin-workers": 'plugin = "aladdin-workers"',
    "cato-sla+slack-routing": cato_sla(),
    "cato-sla-idle10s": cato_sla(10.0),
    "cato-sla-idle60s": cato_sla(60.0),
}
CONFIGS: Final = tuple(AUTOSCALE)
#: CATO's own scheduling for the last configuration: slack ordering, the replica with the smallest wait
#: among those that meet the request's slack (`cato-slack`).
SLACK_ROUTING: Final = """name = "autoscaling-cato-slack"
description = "CATO's slack ordering and replica choice, the coding-assistant SLO classes"

[ordering]
plugin = "slack"

[placement]
picker = { plugin = "cato-slack" }

"""
ROUTING: Final = """name = "autoscaling-cato"
description = "power-of-two routing, the coding-assistant SLO classes and task allotments"

[ordering]
plugin = "fcfs"

[placement]
picker = { plugin = "power-of-two", params = { choices = 2 } }

[[placement.scorers]]
plugin = "least-outstanding"
weight = 1.0

"""


@dataclass(frozen=True, slots=True)
class CatoSetting:
    duration_s: float = 900.0
    rate: float = 2.0  # tasks per second outside the bursts
    bursts: tuple[Burst, ...] = (Burst(150.0, 60.0, 3.0), Burst(450.0, 60.0, 3.0), Burst(720.0, 60.0, 3.0))
    mix: str = "pattern1"
    nodes: int = 2
    devices_per_node: int = 6
    max_per_model: int = 6
    initial_per_model: int = 2
    load_s: float = 30.0
    interval_s: float = 2.0
    scale_in_cooldown_s: float = 30.0


QUICK: Final = CatoSetting(duration_s=240.0, bursts=(Burst(90.0, 45.0, 3.0),))


def policy_text(s: CatoSetting, config: str) -> str:
    preset = CODING_PRESET.read_text()
    start = preset.index("\n[slo]\n") + 1
    text = (SLACK_ROUTING if config.endswith("+slack-routing") else ROUTING) + preset[start:]
    return text + (
        f"\n[autoscale]\n{AUTOSCALE[config]}\ninterval_s = {s.interval_s:g}\n"
        f"scale_in_cooldown_s = {s.scale_in_cooldown_s:g}\nmin_instances = 1\n"
        f"max_instances = {s.max_per_model}\n"
    )


def schedule(s: CatoSetting, seed: int) -> tuple[TaskSpec, ...]:
    """The coding workload's tasks with bursty arrivals; task ids as the runner gives them."""
    tasks = CodingWorkload(s.mix).schedule(
        s.rate, s.duration_s, bursty_arrivals(random.Random(seed), s.bursts), random.Random(seed + 1)
    )
    return tuple(
        dataclasses.replace(t, task_id=f"lg{seed}-{t.index:06d}")
        if t.task_id is None and (t.task_sla_ms is not None or t.multi_step)
        else t
        for t in tasks
    )


def sim_options(s: CatoSetting, config: str, seed: int, work: Path) -> SimOptions:
    work.mkdir(parents=True, exist_ok=True)
    (work / "policy.toml").write_text(policy_text(s, config))
    return SimOptions(
        policy=work / "policy.toml",
        fleet=tuple(EndpointSpec(models=(m,), id=m, profile=PROFILE) for m in MODELS),
        workload=f"coding:{s.mix}+bursts",
        rate=s.rate,
        duration_s=s.duration_s,
        seed=seed,
        models=MODELS,
        sample_every_s=2.0,
        schedule=schedule(s, seed),
        lifecycle=LifecycleOptions(
            models=tuple(ModelSpec(m, 20 * GIB, 1, s.load_s) for m in MODELS),
            nodes=tuple(
                NodeSpec(f"n{k}", tuple(DeviceSpec(f"gpu{i}", 40 * GIB) for i in range(s.devices_per_node)))
                for k in range(s.nodes)
            ),
            evictor="lru",
            settings=LifecycleSettings(churn_guard_s=60.0, drain_timeout_s=120.0, load_deadline_s=300.0),
            stop_s=2.0,
            initial=tuple(InitialInstances(m, s.initial_per_model, InstanceClass.MIXED) for m in MODELS),
        ),
    )


def figures(report: Report) -> dict[str, Any]:
    return {"goodput": task_goodput(report), "attainment": attainment(report), **scaling_figures(report)}


KEYS: Final = (
    "goodput",
    "attainment",
    "utilization",
    "device_utilization",
    "device_hours",
    "peak_devices",
    "scale_ups",
    "actions",
    "hysteresis",
    "lost_requests",
)
COLUMNS: Final = (
    ("goodput", "task goodput", 3),
    ("attainment", "request attainment", 3),
    ("utilization", "utilization", 3),
    ("device_utilization", "device utilization", 3),
    ("device_hours", "device-hours", 2),
    ("peak_devices", "peak devices", 1),
    ("scale_ups", "scale-ups", 1),
    ("actions", "actions", 1),
    ("hysteresis", "hysteresis", 2),
)


def run(
    seeds: Sequence[int],
    quick: bool,
    log: Callable[[str], None],
    *,
    work: Path,
    setting: CatoSetting | None = None,
) -> SettingResult:
    s = setting or (QUICK if quick else CatoSetting())
    runs, timelines = run_configs(
        "cato setting",
        seeds,
        CONFIGS,
        simulate_one=lambda config, seed: simulate(
            sim_options(s, config, seed, work / f"cato-{config}-s{seed}")
        ),
        figures=figures,
        describe=lambda f: (
            f"goodput {f['goodput']:.3f}, utilization {f['utilization']:.3f}, "
            f"{f['device_hours']:.2f} device-h, actions {f['actions']}"
        ),
        log=log,
    )
    rows, cis = pooled_rows(runs, KEYS)
    targets = judge(cis)
    md = [
        f"## CATO's setting: coding tasks on two models, bursts, up to {s.max_per_model} instances each",
        "",
        f"`coding:{s.mix}` at {s.rate:g} tasks/s for {s.duration_s:g} s with bursts at "
        + ", ".join(f"{b.start_s:g}–{b.start_s + b.length_s:g} s ×{b.factor:g}" for b in s.bursts)
        + f"; {len(MODELS)} models on {s.nodes * s.devices_per_node} devices, 1 to {s.max_per_model} "
        f"instances each ({s.initial_per_model} ready at t = 0, {s.load_s:g} s to load), power-of-two "
        f"routing, autoscale interval {s.interval_s:g} s. Seeds {list(seeds)}; means ± 95 % Student t "
        "intervals.",
        "",
        *md_table(cis, COLUMNS),
        "",
        *[
            f"- {t.name}: {t.measured} (target {t.target}): **{'PASS' if t.passed else 'FAIL'}**"
            for t in targets
        ],
        "",
    ]
    return SettingResult(
        name="cato",
        title="CATO: cato-sla vs queue-length (power-of-two routing)",
        rows=rows,
        targets=targets,
        markdown="\n".join(md),
        timelines=timelines,
        meta={
            "setting": {
                **{k: getattr(s, k) for k in s.__dataclass_fields__ if k != "bursts"},
                "bursts": [dataclasses.asdict(b) for b in s.bursts],
            },
            "seeds": list(seeds),
        },
    )


DEVICE_HOURS_RATIO_TARGET: Final = 0.8
GOODPUT_MARGIN: Final = 0.01


def judge(cis: dict[str, dict[str, Any]]) -> list[Target]:
    """CATO's targets for cato-sla as berth counts violations, and for the paper's literal rule:
    device-hours against queue-length's at a goodput within GOODPUT_MARGIN of it (judged), and the
    utilization ratio CATO reports (shown, always passing)."""
    ray = cis["queue-length"]
    u_r, g_r, d_r = mean_of(ray["utilization"]), mean_of(ray["goodput"]), mean_of(ray["device_hours"])
    bound = 1.0 / u_r if u_r > 0 else math.inf  # utilization is at most 1: no scaler beats this ratio
    out: list[Target] = []
    for config in ("cato-sla", "cato-sla-finished"):
        cato = cis[config]
        u_c, g_c, d_c = mean_of(cato["utilization"]), mean_of(cato["goodput"]), mean_of(cato["device_hours"])
        hours = d_c / d_r if d_r > 0 else math.nan
        ratio = u_c / u_r if u_r > 0 else math.nan
        out += [
            Target(
                f"{config}'s device-hours / queue-length's",
                f"{hours:.3f} ({d_c:.2f} vs {d_r:.2f} device-h)",
                f"≤ {DEVICE_HOURS_RATIO_TARGET:g}",
                hours <= DEVICE_HOURS_RATIO_TARGET,
            ),
            Target(
                f"{config}'s task goodput − queue-length's",
                f"{g_c - g_r:+.3f} ({g_c:.3f} vs {g_r:.3f})",
                f"≥ −{GOODPUT_MARGIN:g}",
                g_c - g_r >= -GOODPUT_MARGIN,
            ),
            Target(
                f"(shown) {config}'s mean utilization / queue-length's",
                f"{ratio:.3f} ({u_c:.3f} vs {u_r:.3f}; at most {bound:.2f} for any scaler; "
                "CATO reports 1.41)",
                "-",
                True,
            ),
        ]
    return out
