"""The setup of the prefix-cache benchmark (`prefix`): its workloads, its configurations,
the files of a run and the schedule every configuration of a comparison replays.

Load is stated the same way for every workload, so that no workload (and no trace) is tuned by hand:
the *offered load* ρ is the engine busy time the schedule would cost a fleet with no prefix cache
(`capacity.call_busy_s`: prefill of the whole prompt plus a full batch's share of each decode iteration)
per second, divided by the number of endpoints. A built-in workload's arrival rate and
a trace's time scale are derived from ρ; ρ = 1 saturates a fleet without caches, and the cache's share
of the prefill decides how far below saturation a cache-aware fleet stays (`bound`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from loadgen.bench.scheduling.capacity import call_busy_s
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.profiles import EngineProfile, get_profile
from loadgen.harness import REPO_ROOT
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import get_workload
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.options import WorkloadOptions
from loadgen.workloads.stats import reusable_share

MODEL: Final = "llm-8b"
PROFILE: Final = "fleet-8b-long"
#: The trace's prompts (15,000 tokens on average) need more KV than `PROFILE` has: 16 of them running
#: fill its 262k tokens, leaving nothing to cache. `fleet-8b-trace` is the same engine with 1M tokens.
TRACE_PROFILE: Final = "fleet-8b-trace"
DEFAULT_ENDPOINTS: Final = 8
POLICY_DIR: Final = REPO_ROOT / "policies"
#: The Mooncake-format trace, relative to the repository's parent directory unless --trace names one.
DEFAULT_TRACE: Final = "../shared/traces/mooncake_synthetic_trace.jsonl"
#: A trace without SLOs of its own gets these (sent as headers): a long prompt's uncached prefill on the
#: long-context profile takes seconds (40k tokens: 4 s), and a full batch of long contexts decodes at
#: ~100 ms a token, so the interactive class of chat-and-batch's ATGT.
TRACE_TTFT_MS: Final = 5000.0
TRACE_ITL_MS: Final = 200.0
#: The ATGT of the built-in chat workloads on this profile (their own 100 ms is below a full batch's
#: decode iteration at long contexts, which no placement changes).
CHAT_ITL_MS: Final = 200.0

Prefix = Literal["auto", "approximate", "precise", "off", "oracle"]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str  # the report's name
    preset: str  # berth's SLO preset for it (policies/NAME.toml)
    shared: bool  # has shared prefixes (the targets apply), else the control


WORKLOADS: Final[dict[str, WorkloadSpec]] = {
    "mooncake": WorkloadSpec("mooncake", "chat-and-batch", True),
    "coding": WorkloadSpec("coding", "coding-assistant", True),
    "chat": WorkloadSpec("chat", "chat-and-batch", True),
    "sharegpt-like": WorkloadSpec("sharegpt-like", "chat-and-batch", False),
}


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    policy: str  # "preset" (the workload's berth preset) or a shipped policy file's stem
    prefix: Prefix | None  # the prefix index's source (None: the gateway file's, i.e. auto)
    day_one: bool = False  # endpoints by URL only: no prior, the default cap
    about: str = ""
    # Engines (and berth's prior) that prefill at no cost per token (k1 = 0; the fixed c1 stays): more
    # than any prefix cache gives, since a cache cannot skip the text no call sent before. What the
    # preset reaches there bounds what any prefix placement could add to it.
    free_prefill: bool = False


CONFIGS: Final[dict[str, ConfigSpec]] = {
    "berth": ConfigSpec("preset", "approximate", about="berth's preset, approximate prefix index"),
    "berth-no-prefix": ConfigSpec("preset", "off", about="the same preset without prefix awareness"),
    "oracle": ConfigSpec(
        "preset", "oracle", about="the preset reading every engine's true cache (precise, no event lag)"
    ),
    "precise": ConfigSpec(
        "preset", "precise", about="the preset reading the engines' KV events (the precise source)"
    ),
    "day-one": ConfigSpec("preset", None, day_one=True, about="the preset, endpoints by URL only"),
    "free-prefill": ConfigSpec(
        "preset",
        "approximate",
        free_prefill=True,
        about="the preset on engines whose prefill costs no time per token: what no prefix cache beats",
    ),
    "default": ConfigSpec(
        "default", "approximate", about="the default policy (what berth runs unconfigured)"
    ),
    "prefix-affinity": ConfigSpec(
        "baseline-prefix-affinity", "approximate", about="the cache-aware routers' rule"
    ),
    "least-outstanding": ConfigSpec("baseline-least-outstanding", "off"),
    "power-of-two": ConfigSpec("baseline-power-of-two", "off"),
    "round-robin": ConfigSpec("baseline-round-robin", "off"),
}
BERTH: Final = "berth"
NO_PREFIX: Final = "berth-no-prefix"
ORACLE: Final = "oracle"
PRECISE: Final = "precise"
DAY_ONE: Final = "day-one"
FREE_PREFILL: Final = "free-prefill"
#: The peers' policies as the simulator runs them (the best of them is "the best peer").
PEERS: Final = ("prefix-affinity", "least-outstanding", "power-of-two", "round-robin")


def profile_for(workload: str, given: str | None = None) -> str:
    """The engine profile a workload runs on: `given` (`--profile`), else the trace's or the default."""
    return given or (TRACE_PROFILE if workload == "mooncake" else PROFILE)


def trace_path(given: str | None) -> Path:
    """The trace to replay: `--trace`, else the default relative to the repository's parent (in a git
    worktree, the main checkout's parent when the worktree's has none)."""
    if given:
        return Path(given)
    roots = [REPO_ROOT]
    dotgit = REPO_ROOT / ".git"
    if dotgit.is_file():  # a worktree: "gitdir: MAIN/.git/worktrees/NAME"
        text = dotgit.read_text().strip()
        if text.startswith("gitdir:"):
            roots.append(Path(text.removeprefix("gitdir:").strip()).parent.parent.parent)
    found = [p for r in roots if (p := (r / DEFAULT_TRACE).resolve()).exists()]
    return found[0] if found else (REPO_ROOT / DEFAULT_TRACE).resolve()


def workload_options(workload: str, *, time_scale: float | None = None) -> WorkloadOptions:
    if workload == "mooncake":
        return WorkloadOptions(time_scale=time_scale, slo_ttft_ms=TRACE_TTFT_MS, slo_itl_ms=TRACE_ITL_MS)
    if workload == "coding":
        return WorkloadOptions(sessions=16)
    return WorkloadOptions(slo_itl_ms=CHAT_ITL_MS)


def workload_arg(workload: str, trace: Path) -> str:
    return {"mooncake": f"mooncake:{trace}", "coding": "coding:pattern1"}.get(workload, workload)


def _schedule(
    workload: str, trace: Path, rate: float, duration_s: float, *, seed: int, scale: float | None
) -> list[TaskSpec]:
    opts = workload_options(workload, time_scale=scale)
    run = RunOptions(
        target="sim", workload=workload_arg(workload, trace), rate=rate, duration_s=duration_s, seed=seed,
        models=(MODEL,), workload_options=opts,
    )  # fmt: skip
    return build_schedule(get_workload(run.workload, opts), run)


def busy_s(tasks: Sequence[TaskSpec], profile: EngineProfile) -> float:
    """Engine busy seconds the tasks cost a fleet without prefix caches (the least any router needs)."""
    return sum(call_busy_s(profile, c.prompt_tokens, c.output_tokens) for t in tasks for c in t.calls)


@dataclass(frozen=True, slots=True)
class Load:
    """How a workload is driven at offered load ρ: its rate (tasks/s) or a trace's time scale."""

    load: float  # ρ
    rate: float
    time_scale: float | None


def load_for(
    workload: str, trace: Path, load: float, duration_s: float, endpoints: int, *, profile_name: str = PROFILE
) -> Load:
    """The rate (built-in workloads) or time scale (the trace) that offers `load` × `endpoints` busy
    seconds a second (measured on seed 0's schedule) on engines of `profile_name`."""
    profile = get_profile(profile_name)
    if workload == "mooncake":
        tasks = _schedule(workload, trace, 1.0, 0.0, seed=0, scale=1.0)  # the whole trace, unscaled
        span = max(t.at_s for t in tasks) - min(t.at_s for t in tasks)
        per_s = busy_s(tasks, profile) / max(span, 1e-9)
        return Load(load, 1.0, per_s / (load * endpoints))
    # busy seconds a second at 1 task/s, from a sample large enough that its Poisson noise is small
    sample_rate, sample_s = 10.0, max(duration_s, 120.0)
    tasks = _schedule(workload, trace, sample_rate, sample_s, seed=0, scale=None)
    per_rate = busy_s(tasks, profile) / (sample_rate * sample_s)
    return Load(load, load * endpoints / per_rate, None)


def schedule(
    workload: str, trace: Path, at: Load, duration_s: float, seed: int, *, cut: bool = False
) -> list[TaskSpec]:
    """The schedule of a run; the trace is replayed whole (its reuse spans all of it), time-scaled,
    unless `cut` (then its first `duration_s` scaled seconds)."""
    whole = workload == "mooncake" and not cut
    return _schedule(workload, trace, at.rate, 0.0 if whole else duration_s, seed=seed, scale=at.time_scale)


def fingerprint(tasks: Sequence[TaskSpec]) -> str:
    """A digest of the trace a run replays (arrivals, lengths, prompts' structure)."""
    h = hashlib.sha256()
    for t in tasks:
        h.update(repr((round(t.at_s, 6), t.task_type)).encode())
        for c in t.calls:
            h.update(repr((c.prompt_tokens, c.output_tokens, c.prompt)).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Bound:
    """Offered load without caches and with a perfect cache shared by the fleet (every reusable block a
    hit): what no router can beat."""

    load: float
    load_perfect_cache: float
    reusable_share: float


def bound(
    tasks: Sequence[TaskSpec],
    duration_s: float | None,
    endpoints: int,
    seed: int,
    *,
    profile_name: str = PROFILE,
) -> Bound:
    """The bound of a schedule over `duration_s` (None: the span of its arrivals, for a trace)."""
    profile = get_profile(profile_name)
    if duration_s is None:
        duration_s = max(t.at_s for t in tasks) - min(t.at_s for t in tasks) if tasks else 0.0
    if not tasks or duration_s <= 0:
        return Bound(0.0, 0.0, 0.0)
    share = reusable_share(tasks, block_tokens=profile.block_size, seed=seed).share
    busy = busy_s(tasks, profile)
    saved = profile.latency.k1 * share * sum(c.prompt_tokens for t in tasks for c in t.calls)
    cap = duration_s * endpoints
    return Bound(round(busy / cap, 4), round((busy - saved) / cap, 4), round(share, 4))


# --------------------------------------------------------------------- files
def free_prefill_latency(profile: str) -> LatencyModel:
    """The profile's latency model with prefill free per token (`ConfigSpec.free_prefill`)."""
    return dataclasses.replace(get_profile(profile).latency, k1=0.0)


def fleet_file(endpoints: int, profile: str = PROFILE, *, free_prefill: bool = False) -> str:
    """The fleet: `endpoints` engines of the long-context profile with prefix caching, FCFS (the
    engines' default), one model; with `free_prefill`, prefill costs no time per token."""
    lat = free_prefill_latency(profile)
    latency = (
        [f"latency = {{ k1 = 0.0, c1 = {lat.c1!r}, k2 = {lat.k2!r}, c2 = {lat.c2!r}, c3 = {lat.c3!r} }}"]
        if free_prefill
        else []
    )
    return "\n".join(
        [
            "[defaults]",
            f'profile = "{profile}"',
            *latency,
            "prefix_cache = true",
            "load_time_s = 0.0",
            "",
            "[[endpoints]]",
            f'models = ["{MODEL}"]',
            f"count = {endpoints}",
            "",
        ]
    )


def gateway_toml(*, day_one: bool, profile: str = PROFILE, free_prefill: bool = False) -> str:
    """berth's settings: tuned (the engine's seats as the cap, the profile as the prior, the KV capacity
    and block size for the prefix index, scrapes every 2 s), or day one (every setting at its default);
    with `free_prefill`, the prior of engines that prefill at no cost per token."""
    if day_one:
        return "[limits]\nmax_queue_per_model = 100000\nmax_queue_wait_s = 600.0\n"
    prof = get_profile(profile)
    return "\n".join(
        [
            "[limits]",
            "max_queue_per_model = 100000",
            "max_queue_wait_s = 600.0",
            f"default_endpoint_cap = {prof.max_num_seqs}",
            "[scrape]",
            "interval_s = 2.0",
            "[telemetry]",
            "refresh_interval_s = 1.0",
            f"kv_capacity_tokens = {prof.kv_capacity_tokens}",
            *(free_prefill_latency(profile) if free_prefill else prof.latency).prior_toml(),
            "h = 1.0",
            "j = 1.0",
            "[prefix]",
            f"block_tokens = {prof.block_size}",
            f"index_tokens = {prof.kv_capacity_tokens}",
            "",
        ]
    )


def policy_text(workload: str, config: str) -> str:
    """The policy of a configuration on a workload: berth's preset for the workload as shipped, or a
    baseline as shipped; on `coding` a baseline gets the coding-assistant's SLO class table (the workload
    names its task type as the class, which a policy must know)."""
    spec = CONFIGS[config]
    preset = WORKLOADS[workload].preset
    name = preset if spec.policy == "preset" else spec.policy
    text = (POLICY_DIR / f"{name}.toml").read_text()
    if workload != "coding" or spec.policy == "preset":
        return text
    at = text.find("\n[slo]\n")
    base = text if at < 0 else text[: at + 1]
    coding = (POLICY_DIR / f"{preset}.toml").read_text()
    return base + "\n# The coding-assistant's SLO classes\n" + coding[coding.index("\n[slo]\n") + 1 :]
