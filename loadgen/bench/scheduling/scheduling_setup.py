"""The files of one run of the scheduling benchmark (`policies`): the fleet, berth's configuration and the
policy, in the run's own directory; the simulated and the live run build them alike."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

import orjson

from loadgen.bench.scheduling.scheduling_types import (
    BERTH,
    MODELS,
    POLICIES,
    PROFILE,
    TUNED,
    VARIANTS,
    BenchConfig,
    preset_file,
)
from loadgen.engine_sim.profiles import get_profile
from loadgen.harness import REPO_ROOT

POLICY_DIR: Final = REPO_ROOT / "policies"


# --------------------------------------------------------------------- files
def fleet_file(n_a: int, n_b: int, speed: float, *, config: str = TUNED) -> str:
    """The fleet: `n_a` endpoints of model a, `n_b` of model b; priority scheduling when tuned, the
    engines' default (FCFS) on day one."""
    lines = [
        "[defaults]",
        f'profile = "{PROFILE}"',
        f"speed = {speed}",
        f'scheduling_policy = "{"priority" if config == TUNED else "fcfs"}"',
        "load_time_s = 0.0",
        "",
    ]
    for model, n in zip(MODELS, (n_a, n_b), strict=True):
        if n:
            lines += ["[[endpoints]]", f'models = ["{model}"]', f"count = {n}", ""]
    return "\n".join(lines)


def gateway_toml(
    urls: Sequence[tuple[str, str]], *, port: int, policy: Path, speed: float, config: str = TUNED
) -> str:
    """berth's configuration for a run. Tuned: every endpoint at its engine's seats, priority
    scheduling, the fleet profile as the performance-model prior (times divided by the speed). Day one:
    the endpoints' URLs and the policy, every other setting at its default."""
    out = [
        "[server]",
        f'listen = "127.0.0.1:{port}"',
        'log_level = "warning"',
        "drain_timeout_s = 2.0",
    ]
    if config == TUNED:
        prof = get_profile(PROFILE)
        lat = prof.latency
        s = speed
        out += [
            "[limits]",
            "max_queue_per_model = 8192",
            f"max_queue_wait_s = {600.0 / s:.3f}",
            f"default_endpoint_cap = {prof.max_num_seqs}",
            "[scrape]",
            f"interval_s = {max(0.2, 2.0 / s):.3f}",
            f"stale_after_s = {max(1.0, 10.0 / s):.3f}",
            "[telemetry]",
            f"refresh_interval_s = {max(0.2, 1.0 / s):.3f}",
            f"kv_capacity_tokens = {prof.kv_capacity_tokens}",
            *lat.scaled(s).prior_toml(),
            "h = 1.0",
            "j = 1.0",
        ]
    # absolute: the gateway reads a relative path from its own file's directory, not the caller's
    out += ["[policy]", f"file = {orjson.dumps(str(policy.resolve())).decode()}", ""]
    for i, (url, model) in enumerate(urls):
        out += ["[[endpoints]]", f'url = "{url}"']
        if config == TUNED:
            out += [
                f'id = "{model.split("-")[1]}{i:02d}"',
                'engine = "vllm"',
                f'models = ["{model}"]',
                'scheduling = "priority"',
            ]
        out += [""]
    return "\n".join(out)


def policy_file(name: str, run_dir: Path) -> Path:
    """The policy to run: berth's as shipped; a baseline or another preset as shipped plus the coding
    class table; a variant as its preset with the variant's replacements, plus the table."""
    variant = VARIANTS.get(name)
    shipped = POLICY_DIR / preset_file(variant.preset if variant else name)
    if name == BERTH:
        return shipped
    text = shipped.read_text()
    base = _before_slo(text if variant is None else variant.apply(text))
    coding = (POLICY_DIR / POLICIES[BERTH]).read_text()
    table = coding[coding.index("\n[slo]\n") + 1 :]  # [slo] ... [tasks]: the end of the preset
    path = run_dir / f"{shipped.stem if variant is None else name}.toml"
    path.write_text(
        f"{base}\n# The coding-assistant's SLO classes (the workload names its task type as the class)\n"
        f"{table}"
    )
    return path


def _before_slo(text: str) -> str:
    """A policy file's text up to its [slo] table (the baselines keep theirs at the end)."""
    at = text.find("\n[slo]\n")
    return text if at < 0 else text[: at + 1]


def _models(n_a: int, n_b: int) -> list[str]:
    return [MODELS[0]] * n_a + [MODELS[1]] * n_b


def run_dir_for(
    cfg: BenchConfig, policy: str, *, pattern: str, rate: float, n_a: int, n_b: int, seed: int, config: str
) -> Path:
    tag = f"{config}-{pattern}-r{rate:g}-{n_a}+{n_b}-{policy}" + (f"-s{seed}" if cfg.seeds > 1 else "")
    run_dir = cfg.out / "runs" / tag
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir
