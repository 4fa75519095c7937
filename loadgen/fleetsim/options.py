"""What one simulation runs: the policy, the fleet, the gateway settings and the workload."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.lifecycle import LifecycleOptions
from loadgen.fleetsim.runs import MAX_RUN
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload
from loadgen.workloads.arrivals import ArrivalKind
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.options import WorkloadOptions


@dataclass(frozen=True, slots=True)
class SimOptions:
    policy: Path | None  # a policy file; None: the packaged default policy
    fleet: tuple[EndpointSpec, ...]  # the engine simulator's endpoints, with their gateway-side keys
    gateway: Path | None = None  # gateway.toml for [limits], [scrape], [telemetry]; its endpoints are unused
    workload: str = "sharegpt-like"  # built-in NAME[:VARIANT], mooncake:PATH or a JSONL trace path
    rate: float = 1.0  # mean task arrivals per second
    duration_s: float = 60.0
    arrival: ArrivalKind = "poisson"
    cv: float = 1.0
    seed: int = 0
    models: tuple[str, ...] | None = None  # model slot k -> models[k % len]; None: berth's /v1/models
    slo_headers: bool = False  # send x-berth-ttft-ms / -itl-ms / -deadline-ms from each call's SLO
    request_timeout_s: float = 600.0  # the client gives up on a request after this long
    stall_timeout_s: float = 60.0  # ... or after this long without a byte
    drain_timeout_s: float = 120.0  # after the last arrival, in-flight tasks get this long
    sample_every_s: float = 2.0  # utilization and queue depth are sampled this often
    extra_headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # Models loaded on demand by the gateway's lifecycle (simulated agents): the fleet then has one
    # endpoint per model (id = the model), in berth's endpoint set only while the model is resident.
    lifecycle: LifecycleOptions | None = None
    # The tasks to run, built by the caller (e.g. a benchmark's own arrival process); None: the workload's
    # schedule for rate, duration, arrival and seed (`workload` then only names the run).
    schedule: tuple[TaskSpec, ...] | None = None
    # The prefix index's source, overriding [prefix] source of the gateway file: "auto", "approximate",
    # "off" (no prefix awareness), "oracle" (the simulated engines' true caches), "precise" (their KV
    # events, `prefix_events`); None: the file's.
    prefix: Literal["auto", "approximate", "precise", "off", "oracle"] | None = None
    # Decode iterations over an unchanged batch handled as one event (`loadgen.fleetsim.runs`); 1: every
    # iteration its own event and every token its own step (the same report, slower).
    max_run: int = MAX_RUN
    # Cluster mode: this many berth replicas, each with its own scheduler, queues and telemetry, sharing
    # the engines and the task clocks; a task's calls go to the replicas in turn (round robin over all
    # calls, as a load balancer spreading connections). Every `publish_interval_s` each replica publishes
    # its own load per endpoint and the others add it to theirs (gateway.cluster.member). Not with
    # `lifecycle` (one leader would run it).
    replicas: int = 1
    publish_interval_s: float = 0.5
    workload_options: WorkloadOptions = field(default_factory=WorkloadOptions)  # --sessions, --turns, ...
    # The cyclic garbage collector during the run: "cpython", its own thresholds; "daemon", the daemon's
    # schedule (`gateway.core.heap.GcSchedule`), stepped at every scheduler tick as the daemon's timer
    # steps it between callbacks (`loadgen.fleetsim.collector`). Nothing the run reports depends on it.
    collector: Literal["cpython", "daemon"] = "cpython"


def schedule_of(opts: SimOptions) -> Sequence[TaskSpec]:
    """The tasks the simulation `opts` runs, as built (not sorted): `opts.schedule`, else the workload's
    schedule as the live runner builds it (`build_schedule`: the run's rate, duration, arrival process
    and seed, the workload's options). The simulator, the eviction oracle and a simulated run's record
    all take it from here, so they read the same tasks."""
    if opts.schedule is not None:
        return opts.schedule
    run = RunOptions(
        target="sim",
        workload=opts.workload,
        rate=opts.rate,
        duration_s=opts.duration_s,
        arrival=opts.arrival,
        cv=opts.cv,
        seed=opts.seed,
    )
    return build_schedule(get_workload(opts.workload, opts.workload_options), run)
