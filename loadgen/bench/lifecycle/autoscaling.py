"""`berth-loadgen bench autoscaling [--quick] --out DIR`: the global autoscalers on the fleet
simulator, every setting from the same command.

    berth-loadgen bench autoscaling --out DIR                  # every setting, 3 seeds
    berth-loadgen bench autoscaling --quick --out DIR          # short runs, 2 seeds (a minute or two)
    berth-loadgen bench autoscaling --settings cato --seeds 0,1,2,3 --out DIR

Each setting is a function `(seeds, quick, log) -> SettingResult` (rows with means and 95 % intervals
over the seeds, targets judged PASS/FAIL, a markdown section, a timeline per configuration), listed in
`SETTINGS`; this module runs the chosen ones and writes DIR/report.md, DIR/report.json (each setting's
table, targets and timelines) and, when matplotlib is installed, DIR/autoscaling-SETTING.png (devices and
instances per class over time, seed 0). Everything but the node agents (load and stop times) is the
gateway's own code on the virtual clock: scheduler, lifecycle state machine, autoscale runner and
scalers. The settings:

- `chiron` (`autoscaling_chiron`): interactive bursts + a batch backlog, up to 50 devices:
  chiron vs utilization-band vs aladdin-workers vs static provisioning;
- `cato` (`autoscaling_cato`): the coding workload on two models with bursts: cato-sla vs
  queue-length (Ray Serve's) with power-of-two routing, and aladdin-workers;
- `maaso` (`maaso`, also `berth-loadgen bench maaso`): mixed SLO tightness on 24 devices:
  MaaSO's heterogeneous placement with the sub-cluster filter vs homogeneous replication.

Exit status: 0 when the benchmark ran to the end (its last line says `verdict: PASS` or `verdict:
FAIL`), 2 for a bad command line, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import orjson

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import say
from loadgen.bench.lifecycle import autoscaling_cato, autoscaling_chiron, maaso
from loadgen.bench.lifecycle.autoscaling_common import Burst, SettingResult, Target
from loadgen.bench.skeleton import run_bench


#: name -> the setting's run function (seeds, quick, log, *, work) -> SettingResult.
def run_maaso(
    seeds: Sequence[int],
    quick: bool,
    log: Callable[[str], None],
    *,
    work: Path,
    duration_s: float | None = None,
) -> SettingResult:
    """MaaSO's setting (`maaso`, also its own command `bench maaso`) in this report."""
    doc = maaso.setting(seeds, quick, out=work / "maaso", log=log, duration_s=duration_s)
    return SettingResult(
        name="maaso",
        title="MaaSO: heterogeneous placement vs homogeneous replication",
        rows=list(doc["rows"]),
        targets=[
            Target(
                t["name"] if t["judged"] else f"(shown) {t['name']}",
                "-" if t["measured"] is None else f"{t['measured']:.0%} of the headroom",
                f"≥ {t['target']:.0%}" if t["judged"] else "-",
                bool(t["passed"]) or not t["judged"],
            )
            for t in doc["targets"]
        ],
        markdown=str(doc["markdown"]),
        meta={"setup": doc.get("setup"), "placements": doc.get("placements")},
    )


SETTINGS: Final[dict[str, Callable[..., SettingResult]]] = {
    "chiron": autoscaling_chiron.run,
    "cato": autoscaling_cato.run,
    "maaso": run_maaso,
}


#: `--smoke`: each setting's quick form cut to a minute of arrivals and one short burst, for the test
#: suite's end-to-end run (it checks that every setting runs to its report, not the figures).
SMOKE: Final[dict[str, dict[str, Any]]] = {
    "chiron": {
        "setting": replace(
            autoscaling_chiron.QUICK,
            duration_s=40.0,
            bursts=(Burst(10.0, 10.0, 3.0),),
            backlog=60,
            batch_ttft_s=40.0,
        )
    },
    "cato": {"setting": replace(autoscaling_cato.QUICK, duration_s=40.0, bursts=(Burst(10.0, 10.0, 3.0),))},
    "maaso": {"duration_s": 10.0},
}


@dataclass(frozen=True, slots=True)
class Config:
    out: Path
    settings: tuple[str, ...]
    seeds: tuple[int, ...]
    quick: bool
    smoke: bool = False


def bench(cfg: Config, log: Callable[[str], None] = say) -> dict[str, Any]:
    started = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    results: list[SettingResult] = []
    for name in cfg.settings:
        fn = SETTINGS[name]
        sizes = SMOKE[name] if cfg.smoke else {}
        results.append(fn(cfg.seeds, cfg.quick or cfg.smoke, log, work=cfg.out / "runs", **sizes))
    elapsed = time.perf_counter() - started
    command = "berth-loadgen bench autoscaling " + " ".join(argv_of(cfg))
    doc: dict[str, Any] = {
        "command": command,
        "seeds": list(cfg.seeds),
        "quick": cfg.quick,
        "elapsed_s": round(elapsed, 1),
        "settings": [r.document() for r in results],
        "pass": all(t.passed for r in results for t in r.targets),
    }
    plots = [plot(r, cfg.out) for r in results]
    doc["plots"] = plots
    md = [
        "# Autoscaling (fleet simulator)",
        "",
        f"Command: `{command}` ({elapsed:.0f} s).",
        "",
        *(r.markdown for r in results),
        "## Plots",
        "",
        *(f"- {p}" for p in plots),
        "",
    ]
    (cfg.out / "report.md").write_text("\n".join(md))
    (cfg.out / "report.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    for r in results:
        for t in r.targets:
            verdict = "PASS" if t.passed else "FAIL"
            log(f"target [{r.name}] {t.name}: {t.measured} (target {t.target}): {verdict}")
    log(f"wrote {cfg.out / 'report.md'} and report.json")
    return doc


def plot(result: SettingResult, out: Path) -> str:
    """Devices held and ready instances per class over time, one panel per configuration; the file's
    name, or why there is none."""
    try:
        import matplotlib  # optional: the `plot` extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'berth-gateway[plot]')"
    configs = list(result.timelines)
    if not configs:
        return "no plot: no timeline"
    fig, axes = plt.subplots(len(configs), 1, figsize=(9, 2.2 * len(configs)), sharex=True, squeeze=False)
    for ax, config in zip(axes[:, 0], configs, strict=True):
        tl = result.timelines[config]
        t = tl["t_s"]
        ax.plot(t, tl["devices"], label="devices held", color="black", linewidth=1.2)
        for cls, series in tl["instances_by_class"].items():
            ax.plot(t, series, label=f"{cls} ready", linewidth=0.9)
        ax.set_title(config, fontsize=9)
        ax.set_ylabel("count")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("virtual time (s)")
    fig.tight_layout()
    name = f"autoscaling-{result.name}.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def argv_of(cfg: Config) -> list[str]:
    out = [
        "--out",
        str(cfg.out),
        "--settings",
        ",".join(cfg.settings),
        "--seeds",
        ",".join(map(str, cfg.seeds)),
    ]
    return (["--quick"] if cfg.quick else []) + (["--smoke"] if cfg.smoke else []) + out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth-loadgen bench autoscaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="report directory")
    p.add_argument("--quick", action="store_true", help="short runs of each setting, two seeds")
    p.add_argument("--smoke", action="store_true", help="the smallest run of every setting (seconds)")
    p.add_argument("--seeds", help="comma-separated (default 0,1,2; quick 0,1)")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated of {', '.join(SETTINGS)}")
    return p


def config_from_args(a: argparse.Namespace) -> Config | str:
    settings = tuple(s for s in a.settings.split(",") if s)
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown or not settings:
        return f"unknown setting(s) {', '.join(unknown) or '(none)'} (known: {', '.join(SETTINGS)})"
    try:
        seeds = tuple(int(x) for x in (a.seeds or ("0,1" if a.quick else "0,1,2")).split(","))
    except ValueError as e:
        return f"bad --seeds: {e}"
    if not seeds or len(set(seeds)) != len(seeds):
        return "--seeds: give distinct seeds"
    return Config(out=a.out, settings=settings, seeds=seeds, quick=a.quick, smoke=a.smoke)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(build_parser().parse_args(argv))
    return run_bench(
        BENCHMARKS["autoscaling"],
        cfg,
        functools.partial(bench, log=say),
        passed=lambda doc: bool(doc["pass"]),
    )


if __name__ == "__main__":
    sys.exit(main())
