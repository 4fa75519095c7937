"""The classes benchmark's live setting: its configuration (`LiveConfig`) and one live run's record
(`LiveRun`), the files of a live run (the fleet, each configuration's policy and berth's settings with
every time divided by the speed), the simulator's schedule it replays, and the sockets that needs.
"""

from __future__ import annotations

import dataclasses
import math
import resource
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.scheduling import classes
from loadgen.bench.scheduling.classes_report import Run
from loadgen.engine_sim.fleet import parse_fleet
from loadgen.engine_sim.profiles import get_profile
from loadgen.engine_sim.spec import EndpointSpec
from loadgen.fleetsim.gateway import endpoint_ids
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskSpec

CONFIGS: Final = (classes.BASELINE, classes.BERTH)
DEFAULT_RATE: Final = classes.DEFAULT_RATES[0]  # where (a) is below 0.90: the targets' rate
DEFAULT_SEED: Final = 0
# The setting the simulated figures in docs/benchmarks.md were measured at (3 000 batch requests, 240 s of
# arrivals).
DEFAULT_BACKLOG: Final = 3000
DEFAULT_DURATION_S: Final = 240.0
DEFAULT_SPEED: Final = 2.0
QUICK: Final = {"rate": 4.0, "backlog": 150, "duration_s": 30.0}
#: Sockets a process needs beside its requests' (its listeners, log files, the loop's own, scrapes).
FD_SPARE: Final = 256
#: berth's upstream pool: above the fleet's seats (8 x 128), so scrapes never wait for a stream's socket.
POOL_TOTAL: Final = 2048
#: berth's connect timeout to the engines (default 5 s). Every batch request arrives at t = 0: berth's
#: loop is busy for several seconds admitting them (each arrival and each completion scans the whole
#: queue, O(queue)), and the first wave's 1 024 new engine connections then miss a 5 s bound (with the
#: default, about a third of the first wave failed). The live run measures scheduling, not that burst.
CONNECT_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class LiveConfig:
    out: Path
    rate: float = DEFAULT_RATE
    seed: int = DEFAULT_SEED
    backlog: int = DEFAULT_BACKLOG
    duration_s: float = DEFAULT_DURATION_S
    speed: float = DEFAULT_SPEED
    configs: tuple[str, ...] = CONFIGS
    quick: bool = False
    record: bool = False  # each live run's requests to live/TAG/record.jsonl

    def sim_config(self) -> classes.Config:
        """The simulated benchmark's configuration for the same setting (files under out/sim)."""
        return classes.Config(
            out=self.out / "sim",
            rates=(self.rate,),
            seeds=1,
            backlog=self.backlog,
            duration_s=self.duration_s,
            quick=self.quick,
        )


@dataclass(slots=True)
class LiveRun:
    run: Run  # figures and timeline in simulated seconds
    cpu: dict[str, dict[str, Any]] = field(default_factory=dict)
    valid: bool = True
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


# --------------------------------------------------------------------- files
def live_fleet_file(speed: float) -> str:
    """The simulated benchmark's fleet file with the engines sped up `speed` times."""
    text = classes.fleet_file(classes.ENGINE_SEATS)
    head = "[defaults]\n"
    if not text.startswith(head):
        raise ValueError("classes.fleet_file no longer starts with [defaults]: update classes_live")
    return f"{head}speed = {speed}\n{text[len(head) :]}"


def fleet_specs() -> list[EndpointSpec]:
    """The fleet's endpoints in the file's order (the engine simulator serves them in that order)."""
    return parse_fleet(tomllib.loads(classes.fleet_file(classes.ENGINE_SEATS)))


def live_policy_text(config: str, speed: float) -> str:
    """The configuration's policy (`classes.policy_text`) with chiron's interval divided by the speed."""
    text = classes.policy_text(config)
    if "\n[concurrency]\n" not in text:
        return text
    old = "interval_s = 2.0"
    if old not in text:
        raise ValueError(f"the preset's [concurrency] no longer has {old!r}: update classes_live")
    return text.replace(old, f"interval_s = {2.0 / speed:g}", 1)


def live_gateway_toml(urls: Sequence[str], *, port: int, policy: Path, speed: float) -> str:
    """berth's configuration: the simulated run's (`classes.gateway_toml`, with the defaults it leaves
    to the simulator) with every time divided by `speed`, the listener, and one item per endpoint."""
    s = speed
    lat = get_profile(classes.PROFILE).latency
    out = [
        "[server]",
        f'listen = "127.0.0.1:{port}"',
        'log_level = "warning"',
        "drain_timeout_s = 2.0",
        "[limits]",
        "max_queue_per_model = 100000",
        f"max_queue_wait_s = {7200.0 / s:g}",
        "[upstream]",
        f"connect_timeout_s = {CONNECT_TIMEOUT_S:g}",
        f"pool_per_host = {classes.ENGINE_SEATS + 16}",
        f"pool_total = {POOL_TOTAL}",
        "[scrape]",
        f"interval_s = {2.0 / s:g}",
        f"stale_after_s = {10.0 / s:g}",
        "[telemetry]",
        f"refresh_interval_s = {1.0 / s:g}",
        f"refit_interval_s = {5.0 / s:g}",
        f"first_fit_interval_s = {1.0 / s:g}",
        f"kv_capacity_tokens = {classes.KV_TOKENS}",
        *lat.scaled(s).prior_toml(),
        "h = 1.0",
        "j = 1.0",
        "[policy]",
        f"file = {orjson.dumps(str(policy)).decode()}",
        "",
    ]
    specs = fleet_specs()
    if len(specs) != len(urls):
        raise ValueError(f"{len(urls)} URLs for a fleet of {len(specs)} endpoints")
    for eid, spec, url in zip(endpoint_ids(specs), specs, urls, strict=True):
        out += [
            "[[endpoints]]",
            f'id = "{eid}"',
            f'url = "{url}"',
            f'engine = "{spec.flavor}"',
            f'models = ["{classes.MODEL}"]',
            f'class = "{spec.instance_class}"',
            f"cap = {spec.cap}",
            f'scheduling = "{spec.scheduling_policy}"',
            "",
        ]
    return "\n".join(out)


def schedule(cfg: LiveConfig) -> list[TaskSpec]:
    """The simulator's schedule for the setting (`build_schedule`, same workload and seed), every arrival
    divided by the speed."""
    opts = RunOptions(
        target="sim",
        workload=f"chat-backlog:{cfg.backlog}",
        rate=cfg.rate,
        duration_s=cfg.duration_s,
        seed=cfg.seed,
    )
    tasks = build_schedule(get_workload(opts.workload), opts)
    return [dataclasses.replace(t, at_s=t.at_s / cfg.speed) for t in tasks]


def sockets_needed(cfg: LiveConfig) -> int:
    """File descriptors the busiest process (berth) needs: a client socket per request that may be
    waiting at once (the whole backlog, plus the interactive requests), one per engine seat, and spare."""
    interactive = math.ceil(cfg.rate * cfg.duration_s * 2) + 16  # generous: Poisson, and in flight at once
    seats = sum(n for _, n in classes.FLEET) * classes.ENGINE_SEATS
    return cfg.backlog + interactive + seats + FD_SPARE


def raise_fd_limit(need: int) -> str | None:
    """Raise this process's soft RLIMIT_NOFILE to `need` (children inherit it); why not, or None."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        return (
            f"the run needs {need} open files per process (the backlog's client sockets wait in berth), "
            f"the hard limit is {hard}: raise it (ulimit -Hn) or use a smaller --backlog"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return None
