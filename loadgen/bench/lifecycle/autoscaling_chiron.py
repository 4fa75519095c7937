"""Chiron's setting of the autoscaling benchmark (papers/ALGORITHMS.md §5), in the fleet simulator.

One model (`chat-7b`, profile `fleet-7b` with 128 seats and a 64 k-token KV cache, one device per
instance, 30 s to load) on up to 50 devices (5 nodes × 10). Interactive chat (ShareGPT-like lengths,
TTFT 10 s, ITL 200 ms) arrives as a Poisson process with bursts at 3× the rate, and a backlog of batch
requests (ITL 2 s, TTFT = the batch deadline) is queued at t = 0. Every configuration runs the policy
`policies/chat-and-batch.toml` (instance classes, priority bands, preemption of batch work on mixed
instances, Chiron's local caps) and starts from 2 ready mixed instances; they differ in the global
autoscaler (`[autoscale]`, interval 5 s, scale-in cool-down 60 s, 1 to 50 instances):

- `chiron`: the `chiron` scaler (interactive backpressure band, batch request groups by deadline);
- `utilization-band`: the Llumnix-like baseline (mean utilization in [0.4, 0.8], queued work scales out
  at once);
- `aladdin-workers`: instances = ceil(k5 · arrival rate + c5), fitted online;
- `static`: no autoscaler, a fixed fleet sized from the setting by the rule in `static_size` (reported).

Figures per run: SLO attainment (all requests, interactive, batch; a failed or unfinished request
missed), device-hours (every instance from its start, loading included, to its stop or the end of the
run), peak devices, batch completion time (the last batch request's end), scale-ups, scaling actions and
hysteresis (actions / scale-ups), utilization (share of instances running something, sampled every 5 s).

Target: at equal attainment chiron uses ≤ 0.6× utilization-band's device-hours, or at equal
device-hours its attainment is ≥ 0.3 higher.
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
)
from loadgen.bench.scheduling.classes import PRESET, gateway_toml
from loadgen.engine_sim.profiles import get_profile
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.lifecycle import InitialInstances, LifecycleOptions
from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.sim import simulate
from loadgen.report import Report
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.chat_batch import INTERACTIVE_SLO, ChatBacklogWorkload
from loadgen.workloads.sharegpt import OUTPUT_MEAN, PROMPT_MEAN

MODEL: Final = ModelName("chat-7b")
PROFILE: Final = "fleet-7b"
SEATS: Final = 128
KV_TOKENS: Final = 65_536
GIB: Final = 1 << 30
CONFIGS: Final = ("chiron", "utilization-band", "aladdin-workers", "static")
AUTOSCALE: Final = {
    "chiron": 'plugin = "chiron"\nparams = { theta = 0.33, delta = 0.1 }',
    "utilization-band": 'plugin = "utilization-band"\nparams = { low = 0.4, high = 0.8 }',
    "aladdin-workers": 'plugin = "aladdin-workers"',
}


@dataclass(frozen=True, slots=True)
class ChironSetting:
    duration_s: float = 1200.0  # of interactive arrivals
    rate: float = 3.0  # interactive requests per second outside the bursts
    bursts: tuple[Burst, ...] = (Burst(240.0, 90.0, 3.0), Burst(600.0, 90.0, 3.0), Burst(960.0, 90.0, 3.0))
    backlog: int = 6000  # batch requests queued at t = 0
    batch_ttft_s: float = 900.0  # their deadline
    nodes: int = 5
    devices_per_node: int = 10
    load_s: float = 30.0
    initial: int = 2  # ready mixed instances at t = 0 (autoscaled configurations)
    interval_s: float = 5.0
    scale_in_cooldown_s: float = 60.0

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


QUICK: Final = ChironSetting(
    duration_s=240.0, rate=2.0, bursts=(Burst(90.0, 45.0, 3.0),), backlog=800, batch_ttft_s=240.0
)


def static_size(s: ChironSetting) -> tuple[int, int, str]:
    """(mixed, batch) instances of the static fleet, and why: the fewest that meet both SLOs at the
    setting's peak by the profile's own latency model. Interactive: the seats at the ITL target
    b* = (ITL − c3) / (k2 · l̄ + c2) per instance (l̄ = mean prompt + half the mean output), for the peak
    rate × the longest a request streams at that ITL (mean output × ITL). Batch: the backlog's output
    tokens over its deadline, at the full engine's rate (seats / iteration time at 128 seats)."""
    lat = get_profile(PROFILE).latency
    itl = (INTERACTIVE_SLO.atgt_ms or 200.0) / 1000.0
    ctx = PROMPT_MEAN + OUTPUT_MEAN / 2.0
    per_token = lat.k2 * ctx + lat.c2
    seats_at_itl = min(SEATS, int((itl - lat.c3) / per_token))
    peak = s.rate * max([1.0, *(b.factor for b in s.bursts)])
    concurrent = peak * OUTPUT_MEAN * itl
    mixed = max(1, math.ceil(concurrent / seats_at_itl))
    batch_rate = SEATS / (per_token * SEATS + lat.c3)
    batch = max(1, math.ceil(s.backlog * OUTPUT_MEAN / (s.batch_ttft_s * batch_rate)))
    why = (
        f"interactive: peak {peak:g} req/s × {OUTPUT_MEAN:g} tokens × {itl:g} s = {concurrent:.0f} streams "
        f"over {seats_at_itl} seats per instance at the ITL target → {mixed} mixed; batch: "
        f"{s.backlog} × {OUTPUT_MEAN:g} tokens over {s.batch_ttft_s:g} s at {batch_rate:.0f} tokens/s per "
        f"full instance → {batch} batch"
    )
    return mixed, batch, why


def schedule(s: ChironSetting, seed: int) -> tuple[TaskSpec, ...]:
    """The chat-backlog workload's tasks with bursty interactive arrivals and the batch deadline."""
    tasks = ChatBacklogWorkload(str(s.backlog)).schedule(
        s.rate, s.duration_s, bursty_arrivals(random.Random(seed), s.bursts), random.Random(seed + 1)
    )
    ttft_ms = s.batch_ttft_s * 1000.0
    out = []
    for t in tasks:
        if t.task_type == "batch":
            calls = tuple(
                dataclasses.replace(c, slo=dataclasses.replace(c.slo, ttft_ms=ttft_ms)) for c in t.calls
            )
            out.append(dataclasses.replace(t, calls=calls))
        else:
            out.append(t)
    return tuple(out)


def policy_text(s: ChironSetting, config: str) -> str:
    text = PRESET.read_text()
    old = "ttft_ms = 3600000.0"
    if old not in text:
        raise ValueError(f"the preset no longer has {old!r}: update the benchmark's batch deadline")
    text = text.replace(old, f"ttft_ms = {s.batch_ttft_s * 1000.0:.1f}")
    if config in AUTOSCALE:
        text += (
            f"\n[autoscale]\n{AUTOSCALE[config]}\ninterval_s = {s.interval_s:g}\n"
            f"scale_in_cooldown_s = {s.scale_in_cooldown_s:g}\nmin_instances = 1\n"
            f"max_instances = {s.devices}\n"
        )
    return text


def sim_options(s: ChironSetting, config: str, seed: int, work: Path) -> SimOptions:
    work.mkdir(parents=True, exist_ok=True)
    (work / "gateway.toml").write_text(gateway_toml())
    (work / "policy.toml").write_text(policy_text(s, config))
    initial: tuple[InitialInstances, ...]
    if config == "static":
        mixed, batch, _ = static_size(s)
        initial = (
            InitialInstances(MODEL, mixed, InstanceClass.MIXED),
            InitialInstances(MODEL, batch, InstanceClass.BATCH),
        )
    else:
        initial = (InitialInstances(MODEL, s.initial, InstanceClass.MIXED),)
    drain = 3600.0
    return SimOptions(
        policy=work / "policy.toml",
        fleet=(
            EndpointSpec(
                models=(MODEL,),
                id=MODEL,
                profile=PROFILE,
                max_num_seqs=SEATS,
                kv_capacity_tokens=KV_TOKENS,
                cap=SEATS,
                scheduling_policy="priority",
            ),
        ),
        gateway=work / "gateway.toml",
        workload=f"chat-backlog:{s.backlog}+bursts",
        rate=s.rate,
        duration_s=s.duration_s,
        seed=seed,
        models=(MODEL,),
        request_timeout_s=drain + s.duration_s,
        stall_timeout_s=drain,
        drain_timeout_s=drain,
        sample_every_s=5.0,
        schedule=schedule(s, seed),
        lifecycle=LifecycleOptions(
            models=(ModelSpec(MODEL, 20 * GIB, 1, s.load_s),),
            nodes=tuple(
                NodeSpec(f"n{k}", tuple(DeviceSpec(f"gpu{i}", 40 * GIB) for i in range(s.devices_per_node)))
                for k in range(s.nodes)
            ),
            evictor="lru",
            settings=LifecycleSettings(churn_guard_s=60.0, drain_timeout_s=600.0, load_deadline_s=600.0),
            stop_s=2.0,
            initial=initial,
        ),
    )


def figures(report: Report) -> dict[str, Any]:
    batch_ends = [r.sent_at_s + r.e2e_s for r in report.requests if r.cls == "batch" and r.ok and r.e2e_s]
    return {
        "attainment": attainment(report),
        "interactive_attainment": attainment(report, "interactive"),
        "batch_attainment": attainment(report, "batch"),
        "batch_done_s": max(batch_ends) if batch_ends else None,
        **scaling_figures(report),
    }


KEYS: Final = (
    "attainment",
    "interactive_attainment",
    "batch_attainment",
    "device_hours",
    "peak_devices",
    "batch_done_s",
    "scale_ups",
    "actions",
    "hysteresis",
    "utilization",
    "lost_requests",
)
COLUMNS: Final = (
    ("attainment", "attainment", 3),
    ("interactive_attainment", "interactive", 3),
    ("batch_attainment", "batch", 3),
    ("device_hours", "device-hours", 2),
    ("peak_devices", "peak devices", 1),
    ("batch_done_s", "batch done (s)", 0),
    ("scale_ups", "scale-ups", 1),
    ("actions", "actions", 1),
    ("hysteresis", "hysteresis", 2),
    ("utilization", "utilization", 3),
)


def run(
    seeds: Sequence[int],
    quick: bool,
    log: Callable[[str], None],
    *,
    work: Path,
    setting: ChironSetting | None = None,
) -> SettingResult:
    s = setting or (QUICK if quick else ChironSetting())
    runs, timelines = run_configs(
        "chiron setting",
        seeds,
        CONFIGS,
        simulate_one=lambda config, seed: simulate(
            sim_options(s, config, seed, work / f"chiron-{config}-s{seed}")
        ),
        figures=figures,
        describe=lambda f: (
            f"attainment {f['attainment']:.3f} (interactive {f['interactive_attainment']:.3f}, batch "
            f"{f['batch_attainment']:.3f}), {f['device_hours']:.2f} device-h, peak {f['peak_devices']}, "
            f"actions {f['actions']}"
        ),
        log=log,
    )
    rows, cis = pooled_rows(runs, KEYS)
    targets = judge(cis)
    mixed, batch, why = static_size(s)
    md = [
        f"## Chiron's setting: interactive bursts + a batch backlog, up to {s.devices} devices",
        "",
        f"Interactive chat at {s.rate:g} req/s for {s.duration_s:g} s with bursts at "
        + ", ".join(f"{b.start_s:g}–{b.start_s + b.length_s:g} s ×{b.factor:g}" for b in s.bursts)
        + f"; {s.backlog} batch requests queued at t = 0 with a TTFT deadline of {s.batch_ttft_s:g} s. "
        f"One device per instance, {s.load_s:g} s to load; autoscaled runs start from {s.initial} mixed "
        f"instances (1 to {s.devices}, interval {s.interval_s:g} s, scale-in cool-down "
        f"{s.scale_in_cooldown_s:g} s). Static: {mixed} mixed + {batch} batch instances ({why}). "
        f"Seeds {list(seeds)}; means ± 95 % Student t intervals.",
        "",
        *md_table(cis, COLUMNS),
        "",
        *target_lines(targets),
        "",
    ]
    return SettingResult(
        name="chiron",
        title="Chiron: chiron vs utilization-band vs static",
        rows=rows,
        targets=targets,
        markdown="\n".join(md),
        timelines=timelines,
        meta={
            "setting": {
                **{k: getattr(s, k) for k in s.__dataclass_fields__ if k != "bursts"},
                "bursts": [dataclasses.asdict(b) for b in s.bursts],
            },
            "static": {"mixed": mixed, "batch": batch, "why": why},
            "seeds": list(seeds),
        },
    )


def judge(cis: dict[str, dict[str, Any]]) -> list[Target]:
    ch, band = cis["chiron"], cis["utilization-band"]
    a_ch, a_band = mean_of(ch["attainment"]), mean_of(band["attainment"])
    d_ch, d_band = mean_of(ch["device_hours"]), mean_of(band["device_hours"])
    ratio = d_ch / d_band if d_band > 0 else math.nan
    equal_att = a_ch >= a_band - 0.01
    equal_dev = abs(ratio - 1.0) <= 0.1
    t1 = Target(
        "at equal attainment (chiron ≥ band − 0.01), chiron's device-hours / utilization-band's",
        f"{ratio:.3f} (attainment {a_ch:.3f} vs {a_band:.3f})",
        "≤ 0.6",
        equal_att and ratio <= 0.6,
    )
    t2 = Target(
        "at equal device-hours (within ±10 %), chiron's attainment − utilization-band's",
        f"{a_ch - a_band:+.3f} (device-hours ratio {ratio:.3f}{'' if equal_dev else ': not equal'})",
        "≥ +0.3",
        equal_dev and a_ch - a_band >= 0.3,
    )
    either = Target("Chiron's target (either of the two)", "", "one PASS", t1.passed or t2.passed)
    return [t1, t2, either]


def target_lines(targets: Sequence[Target]) -> list[str]:
    return [
        f"- {t.name}: {t.measured} (target {t.target}): **{'PASS' if t.passed else 'FAIL'}**" for t in targets
    ]
