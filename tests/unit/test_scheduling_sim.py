"""The scheduling benchmark on the offline fleet simulator: the same fleet and gateway files as the live
path (tuned and day-one), the options' defaults, and one tiny benchmark end to end."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import orjson
import pytest

from gateway.config import load_gateway_config
from gateway.config.policy import load_policy
from gateway.config.schema import LimitsConfig, ScrapeConfig, TelemetryConfig
from gateway.sched.plugins import default_registry
from loadgen.bench.scheduling import scheduling_setup
from loadgen.bench.scheduling.policies import bench, build_parser, config_from_args
from loadgen.bench.scheduling.scheduling_setup import fleet_file, gateway_toml
from loadgen.bench.scheduling.scheduling_types import (
    CONFIGS,
    DAY_ONE,
    DEFAULT_PATTERNS,
    DEFAULT_RATES,
    DEFAULT_SEEDS,
    PROFILE,
    QUICK_SEEDS,
    TUNED,
    BenchConfig,
    Variant,
)
from loadgen.cli import main as loadgen_main
from loadgen.engine_sim.fleet import parse_fleet
from loadgen.engine_sim.profiles import get_profile

POLICY = scheduling_setup.POLICY_DIR / "coding-assistant.toml"
URLS = [("http://e000.sim", "code-a-7b"), ("http://e001.sim", "code-b-7b")]


@pytest.mark.parametrize(
    ("config", "engine_policy"), [(TUNED, "priority"), (DAY_ONE, "fcfs")], ids=["tuned", "day-one"]
)
def test_the_fleet_file_sets_the_engines_scheduling(config: str, engine_policy: str) -> None:
    specs = parse_fleet(tomllib.loads(fleet_file(3, 1, 1.0, config=config)))
    assert [s.models for s in specs] == [("code-a-7b",)] * 3 + [("code-b-7b",)]
    assert {(s.profile, s.scheduling_policy, s.cap, s.speed) for s in specs} == {
        (PROFILE, engine_policy, None, 1.0)
    }


def test_the_tuned_gateway_is_the_live_one_at_speed_one(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(gateway_toml(URLS, port=8080, policy=POLICY, speed=1.0))
    cfg = load_gateway_config(path)
    prof = get_profile(PROFILE)
    assert cfg.limits.default_endpoint_cap == prof.max_num_seqs
    assert (cfg.scrape.interval_s, cfg.telemetry.refresh_interval_s) == (2.0, 1.0)
    assert cfg.telemetry.prior.k1 == pytest.approx(prof.latency.k1)
    assert [(e.scheduling, e.cap, e.models) for e in cfg.endpoints] == [
        ("priority", None, ("code-a-7b",)),
        ("priority", None, ("code-b-7b",)),
    ]
    # the live path's file at speed 2: the same settings, times halved
    path.write_text(gateway_toml(URLS, port=8080, policy=POLICY, speed=2.0))
    assert load_gateway_config(path).telemetry.prior.k1 == pytest.approx(prof.latency.k1 / 2)


def test_a_run_directory_given_relative_to_the_caller_still_finds_its_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--out` relative to the working directory: the run's gateway file names its policy so that the
    gateway, which reads a relative path from the file's own directory, finds it."""
    monkeypatch.chdir(tmp_path)
    run_dir = Path("out") / "runs" / "one"
    run_dir.mkdir(parents=True)
    policy = scheduling_setup.policy_file("aladdin", run_dir)
    assert not policy.is_absolute()  # written where the caller said, as the caller said it
    gw = run_dir / "gateway.toml"
    gw.write_text(gateway_toml(URLS, port=8080, policy=policy, speed=1.0))
    cfg = load_gateway_config(gw)
    assert cfg.policy_file == tmp_path / run_dir / "aladdin.toml"


def test_the_day_one_gateway_is_urls_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(gateway_toml(URLS, port=8080, policy=POLICY, speed=2.0, config=DAY_ONE))
    cfg = load_gateway_config(path)
    assert (cfg.limits, cfg.scrape, cfg.telemetry) == (LimitsConfig(), ScrapeConfig(), TelemetryConfig())
    assert cfg.limits.default_endpoint_cap == 64
    assert [(e.url, e.id, e.engine, e.models, e.cap, e.scheduling) for e in cfg.endpoints] == [
        (url, None, None, (), None, "fcfs") for url, _ in URLS
    ]
    assert cfg.policy_file == POLICY


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {"live": False, "configs": CONFIGS, "seeds": DEFAULT_SEEDS, "aladdin": True}),
        (["--live"], {"live": True, "configs": (TUNED,), "seeds": 1, "aladdin": True}),
        (["--live", "--configs", "tuned,day-one", "--seeds", "2"], {"configs": CONFIGS, "seeds": 2}),
        (
            ["--quick"],
            {
                "seeds": QUICK_SEEDS,
                "patterns": DEFAULT_PATTERNS[:1],
                "rates": {DEFAULT_PATTERNS[0]: DEFAULT_RATES[DEFAULT_PATTERNS[0]][-1:]},
                "aladdin": False,
            },
        ),
        (
            ["--day-one-check"],
            {
                "configs": (DAY_ONE,),
                "seeds": 1,
                "seed": 11,
                "patterns": ("pattern1",),
                "rates": {"pattern1": (12.0,)},
                "duration_s": 60.0,
                "endpoints_per_model": 6,
                "aladdin": False,
            },
        ),
    ],
    ids=["simulator", "live", "live both configs", "quick", "day-one check"],
)
def test_the_defaults_per_path(argv: list[str], expected: dict[str, object]) -> None:
    cfg = config_from_args(build_parser().parse_args(argv))
    assert isinstance(cfg, BenchConfig)
    assert {k: getattr(cfg, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--policies", "berth,fifo"], "unknown policies: fifo"),
        (["--configs", "tuned,week-two"], "--configs: expected a subset of tuned, day-one"),
        (["--seeds", "0"], "--seeds must be at least 1"),
    ],
    ids=["policy", "config", "seeds"],
)
def test_bad_options_are_refused(argv: list[str], error: str) -> None:
    assert config_from_args(build_parser().parse_args(argv)) == error


async def test_a_tiny_benchmark_runs_on_the_simulator(tmp_path: Path) -> None:
    cfg = BenchConfig(
        out=tmp_path,
        duration_s=5.0,
        patterns=("pattern1",),
        rates={"pattern1": (2.0,)},
        policies=("berth", "least-outstanding"),
        endpoints_per_model=2,
        seeds=2,
        aladdin_rate=2.0,
        record=True,
    )
    t0 = time.monotonic()
    doc = await bench(cfg)
    assert time.monotonic() - t0 < 30  # about 2 s; generous for a loaded machine
    runs = doc["runs"]
    assert len(runs) == 2 * 2 * 2  # configurations x seeds x policies
    assert {(r["mode"], r["valid"]) for r in runs} == {("sim", True)}
    assert {(r["config"], r["seed"]) for r in runs} == {(c, s) for c in CONFIGS for s in (1, 2)}
    assert all(r["overall_goodput"] is not None and r["left_out"] for r in runs)
    # Aladdin's search: 4 endpoints is both the bottom and the top of its range here
    assert set(doc["aladdin"]["fewest"]) == {"berth", "least-outstanding"}
    assert {r["seed"] for r in doc["aladdin"]["runs"]} == {1, 2}
    text = (tmp_path / "report.md").read_text()
    assert text.index("What the simulator leaves out:") < text.index("## Targets")
    assert "2 seeds per comparison (1, 2); 8 runs in the sweep, wall time per run" in text
    assert "### day-one configuration" in text
    assert "## Tuned vs day-one" in text
    assert "- pattern1 at 2 tasks/s: **" in text
    # every run's files: reproducible with `berth-loadgen sim`, and its requests recorded
    run_dir = tmp_path / "runs" / "day-one-pattern1-r2-2+2-least-outstanding-s2"
    assert {p.name for p in run_dir.iterdir()} >= {
        "fleet.toml",
        "gateway.toml",
        "loadgen.json",
        "record.jsonl",
    }
    report = orjson.loads((run_dir / "loadgen.json").read_bytes())
    records = [orjson.loads(x) for x in (run_dir / "record.jsonl").read_bytes().splitlines()]
    assert len(records) == report["overall"]["count"]
    assert all(r["observed"]["sent_at"] >= r["at"] for r in records)


def _best_fit(policy: Path) -> dict[str, object]:
    filters = tomllib.loads(policy.read_text())["placement"]["filters"]
    params = next(f["params"] for f in filters if f["plugin"] == "best-fit")
    assert isinstance(params, dict)
    return params


def test_the_paper_variant_is_the_aladdin_preset_in_the_papers_order(tmp_path: Path) -> None:
    preset = _best_fit(scheduling_setup.policy_file("aladdin", tmp_path))
    paper_file = scheduling_setup.policy_file("aladdin-paper", tmp_path)
    paper = _best_fit(paper_file)
    assert preset["order"] == "least-outstanding"
    assert (paper["order"], paper["rebalance_threshold"], paper["deadlines"]) == ("most-loaded", 0.5, False)
    # nothing else differs, and both carry the coding classes
    same = ("order", "rebalance_threshold", "deadlines")
    assert {k: v for k, v in paper.items() if k not in same} == {
        k: v for k, v in preset.items() if k not in same
    }
    assert "[[slo.classes]]" in paper_file.read_text()
    assert load_policy(paper_file, default_registry(), seed=0).name == "aladdin"
    assert isinstance(
        config_from_args(build_parser().parse_args(["--policies", "aladdin,aladdin-paper"])), BenchConfig
    )


def test_a_variant_whose_text_is_gone_from_its_preset_says_so() -> None:
    v = Variant("aladdin", (("no such text", "x"),), "broken")
    with pytest.raises(ValueError, match="occurs 0 times"):
        v.apply("[placement]\n")


def test_berth_loadgen_bench_scheduling_runs_it(tmp_path: Path) -> None:
    argv = [
        "--out",
        str(tmp_path),
        "--duration",
        "3",
        "--seeds",
        "1",
        "--rates",
        "1",
        "--patterns",
        "pattern2",
    ]
    argv += ["--policies", "berth,round-robin", "--configs", "day-one", "--no-aladdin"]
    assert loadgen_main(["bench", "scheduling", *argv]) == 0
    doc = orjson.loads((tmp_path / "report.json").read_bytes())
    assert doc["config"]["mode"] == "sim"
    assert [(r["config"], r["policy"]) for r in doc["runs"]] == [(DAY_ONE, "berth"), (DAY_ONE, "round-robin")]
