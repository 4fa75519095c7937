"""The scheduling benchmark's target checks: each policy judged on its mean over the seeds, with 95 %
confidence intervals (Student t) beside the margins."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import orjson
import pytest

from loadgen.bench.scheduling import scheduling_search
from loadgen.bench.scheduling.scheduling_report import floor_lines, ratio_fleet, target_check, verdict
from loadgen.bench.scheduling.scheduling_stats import mean_ci, policy_means, t95
from loadgen.bench.scheduling.scheduling_tables import day_one_table, run_row
from loadgen.bench.scheduling.scheduling_types import BenchConfig, RunResult

CPU = {p: {"cpu_share": 0.3, "runqueue_share": 0.01} for p in ("berth", "loadgen", "sim")}


def run(policy: str, goodput: float, *, seed: int = 1, rate: float = 10.0, **tasks: float) -> RunResult:
    return RunResult(
        policy=policy,
        pattern="pattern1",
        rate=rate,
        endpoints=(6, 6),
        wall_s=60.0,
        tasks={t: {"goodput": g} for t, g in tasks.items()},
        overall_goodput=goodput,
        request_goodput=goodput,
        utilization=0.8,
        busy_share=0.8,
        cpu=CPU,
        valid=True,
        errors={},
        berth_rejections=0,
        seed=seed,
    )


def test_policy_means_average_over_seeds_and_keep_the_range() -> None:
    means = policy_means(
        [
            run("berth", 0.80, seed=1, generation=0.5),
            run("round-robin", 0.70, seed=1, generation=0.4),
            run("berth", 0.90, seed=2, generation=0.7),
            run("round-robin", 0.74, seed=2),  # no generation figure in this run
        ]
    )
    berth, rr = means
    assert (berth.policy, berth.runs, berth.low, berth.high) == ("berth", 2, 0.80, 0.90)
    assert abs(berth.goodput - 0.85) < 1e-9
    assert abs(berth.tasks["generation"] - 0.6) < 1e-9
    assert (rr.policy, rr.tasks["generation"]) == ("round-robin", 0.4)
    assert abs(rr.goodput - 0.72) < 1e-9


def test_target_check_judges_the_means_at_the_heaviest_rate() -> None:
    runs = [
        run("berth", 0.99, rate=8.0, completion=1.0),  # a lighter rate: not judged
        run("berth", 0.86, seed=1, completion=1.0, translation=0.80),
        run("berth", 0.84, seed=2, completion=1.0, translation=0.84),
        run("least-outstanding", 0.76, seed=1, completion=0.9, translation=0.86),
        run("least-outstanding", 0.72, seed=2, completion=0.9, translation=0.84),
        run("round-robin", 0.70, seed=1, completion=0.9, translation=0.88),
    ]
    text = "\n".join(target_check(runs, "pattern1"))
    assert "berth 0.850 vs best baseline least-outstanding 0.740: +0.110 (MET" in text
    assert "means of 2 and 2 seeds; single runs: berth 0.840-0.860, least-outstanding 0.720-0.760" in text
    # translation: berth's mean 0.82 against the best baseline mean for it (round robin, 0.88)
    assert "worst task type vs the best baseline for it: translation 0.820 vs 0.880 (-0.060; NOT MET" in text


def test_a_single_seed_reads_as_before() -> None:
    runs = [run("berth", 0.80, generation=0.5), run("round-robin", 0.75, generation=0.51)]
    text = "\n".join(target_check(runs, "pattern1"))
    assert "berth 0.800 vs best baseline round-robin 0.750: +0.050 (NOT MET: target +0.10)" in text
    assert "seeds" not in text
    assert "generation 0.500 vs 0.510 (-0.010; MET" in text


def test_rows_name_their_seed() -> None:
    assert run_row(run("berth", 0.8, seed=3))[:3] == ["10", "3", "berth"]


def test_merge_makes_one_report_from_runs_measured_apart(tmp_path: Path) -> None:
    from loadgen.bench.scheduling.policies import merge

    def out(name: str, runs: list[RunResult], aladdin: dict[str, object] | None = None) -> Path:
        d = tmp_path / name
        d.mkdir()
        doc = {"runs": [r.to_dict() for r in runs], "aladdin": aladdin}
        (d / "report.json").write_bytes(orjson.dumps(doc))
        return d

    search = {"rate": 6.0, "pattern": "pattern1", "fewest": {"least-outstanding": 6}, "runs": []}
    baselines = out("base", [run("least-outstanding", 0.70, translation=0.85)], search)
    mine = out("berth", [run("berth", 0.82, translation=0.84)])
    merged = tmp_path / "merged"
    assert merge(BenchConfig(out=merged), [baselines, mine]) == 0
    doc = orjson.loads((merged / "report.json").read_bytes())
    assert [r["policy"] for r in doc["runs"]] == ["least-outstanding", "berth"]
    assert doc["aladdin"]["fewest"] == {"least-outstanding": 6}
    text = (merged / "report.md").read_text()
    assert "berth 0.820 vs best baseline least-outstanding 0.700: +0.120 (MET" in text
    assert "translation 0.840 vs 0.850 (-0.010; MET" in text


def test_the_ratio_fleet_is_the_largest_that_meets_the_ratio() -> None:
    assert [ratio_fleet(n) for n in (4, 6, 10, 20)] == [2, 4, 7, 14]


async def test_both_policies_run_on_the_ratio_fleet_unless_the_search_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[str, int, int, int | None]] = []

    async def fake_run(
        cfg: BenchConfig,
        policy: str,
        *,
        pattern: str,
        rate: float,
        n_a: int,
        n_b: int,
        seed: int | None = None,
        config: str = "tuned",
    ) -> RunResult:
        assert (pattern, rate, config) == (cfg.aladdin_pattern, cfg.aladdin_rate, "tuned")
        ran.append((policy, n_a, n_b, seed))
        return dataclasses.replace(run(policy, 0.5, seed=seed or 1), endpoints=(n_a, n_b))

    monkeypatch.setattr(scheduling_search, "run_one", fake_run)
    cfg = BenchConfig(out=tmp_path, seeds=2)
    searched = [dataclasses.replace(run("berth", 0.8), endpoints=(3, 1))]  # the search's own run at 4
    out = await scheduling_search.at_ratio_fleet(
        cfg, {"berth": 6, "least-outstanding": 6}, searched, lambda _: None
    )
    assert ran == [("least-outstanding", 3, 1, 1), ("least-outstanding", 3, 1, 2)]  # once per seed
    assert [r.endpoints for r in out] == [(3, 1), (3, 1)]
    ran.clear()
    no_baseline = {"berth": 6, "least-outstanding": None}
    assert await scheduling_search.at_ratio_fleet(cfg, no_baseline, [], lambda _: None) == []
    assert ran == []


def test_the_floor_lines_quote_each_policy_on_the_ratio_fleet() -> None:
    there = [
        dataclasses.replace(run("berth", 0.795), endpoints=(3, 1)),
        dataclasses.replace(run("least-outstanding", 0.204), endpoints=(3, 1)),
        dataclasses.replace(run("berth", 0.99), endpoints=(5, 1)),
    ]
    line = floor_lines("pattern1", 6.0, {"berth": 6, "least-outstanding": 6}, there)[1]
    assert line.endswith("; goodput there: berth 0.795, least-outstanding 0.204")


# --------------------------------------------------------------------- confidence intervals
@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706), (4, 2.776), (30, 2.042), (31, 2.0395), (60, 2.0003), (120, 1.9799), (10_000, 1.9602)],
    ids=["1", "4", "30 (table end)", "31 (expansion)", "60", "120", "10000"],
)
def test_t95_is_students_two_sided_quantile(df: int, expected: float) -> None:
    assert t95(df) == pytest.approx(expected, abs=2e-4)


def test_t95_needs_a_degree_of_freedom() -> None:
    with pytest.raises(ValueError, match="degree of freedom"):
        t95(0)


@pytest.mark.parametrize(
    ("values", "mean", "half"),
    [
        ([1.0, 2.0, 3.0, 4.0, 5.0], 3.0, 2.776 * math.sqrt(2.5 / 5)),  # s² = 2.5, t(4) = 2.776
        ([0.80, 0.90], 0.85, 12.706 * 0.05),  # s = 0.0707, s / √2 = 0.05
        ([0.7, 0.7, 0.7], 0.7, 0.0),
        ([0.42], 0.42, None),  # one run: no interval
    ],
    ids=["five", "two", "constant", "one"],
)
def test_mean_ci(values: list[float], mean: float, half: float | None) -> None:
    ci = mean_ci(values)
    assert ci.mean == pytest.approx(mean)
    assert ci.n == len(values)
    if half is None:
        assert ci.half is None
        assert ci.text() == f"{mean:.3f}"
    else:
        assert ci.half == pytest.approx(half, abs=1e-9)
        assert ci.text().startswith(f"{mean:.3f} ±")


def test_mean_ci_refuses_nothing() -> None:
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])


# --------------------------------------------------------------------- verdicts on synthetic numbers
def seeds(policy: str, goodputs: list[float], **tasks: list[float]) -> list[RunResult]:
    return [
        run(policy, g, seed=i + 1, **{t: vals[i] for t, vals in tasks.items()})
        for i, g in enumerate(goodputs)
    ]


BASE = seeds(
    "least-outstanding", [0.70, 0.72, 0.71, 0.69, 0.73], completion=[0.90] * 5, translation=[0.80] * 5
)
RR = seeds("round-robin", [0.60, 0.61, 0.62, 0.60, 0.62], completion=[0.95] * 5, translation=[0.70] * 5)


@pytest.mark.parametrize(
    ("berth", "passed", "overall_ok", "tasks_ok"),
    [
        (
            seeds("berth", [0.85, 0.83, 0.82, 0.80, 0.80], completion=[0.95] * 5, translation=[0.79] * 5),
            True,
            True,
            True,
        ),
        (
            seeds("berth", [0.79, 0.81, 0.81, 0.79, 0.80], completion=[0.95] * 5, translation=[0.80] * 5),
            False,
            False,
            True,
        ),
        (seeds("berth", [0.90] * 5, completion=[0.92] * 5, translation=[0.85] * 5), False, True, False),
        (seeds("berth", [0.81] * 5, completion=[0.95] * 5, translation=[0.78] * 5), True, True, True),
    ],
    ids=[
        "pass",
        "margin short",
        "a task type 0.03 below the best baseline for it",
        "both exactly at the target",
    ],
)
def test_the_verdict_judges_the_means(
    berth: list[RunResult], passed: bool, overall_ok: bool, tasks_ok: bool
) -> None:
    v = verdict([*berth, *BASE, *RR], "pattern1")
    assert v is not None
    assert (v.passed, v.overall_ok, v.tasks_ok) == (passed, overall_ok, tasks_ok)
    assert v.best.policy == "least-outstanding"
    # completion: the best baseline for it is round robin (0.95), not the best one overall
    assert {t.task: t.best_policy for t in v.tasks} == {
        "completion": "round-robin",
        "translation": "least-outstanding",
    }


def test_the_verdict_pairs_the_seeds_for_the_difference() -> None:
    berth = seeds("berth", [0.81, 0.83, 0.82, 0.79, 0.84], completion=[1.0] * 5)
    v = verdict([*berth, *BASE], "pattern1")
    assert v is not None
    assert v.diff == pytest.approx(0.818 - 0.71)
    # one trace per seed: berth leads by 0.10-0.11 on every seed, so the paired interval is far narrower
    # than either policy's own
    assert v.paired is not None
    assert v.paired.mean == pytest.approx(0.108)
    assert v.paired.half is not None
    assert v.berth.goodput_ci.half is not None
    assert v.paired.half < v.berth.goodput_ci.half / 3
    assert v.best.goodput_ci.half == pytest.approx(2.776 * math.sqrt(0.00025 / 5))


def test_the_target_lines_say_pass_or_fail_with_the_half_widths() -> None:
    berth = seeds("berth", [0.85, 0.83, 0.82, 0.80, 0.80], completion=[0.95] * 5, translation=[0.79] * 5)
    text = "\n".join(target_check([*berth, *BASE, *RR], "pattern1"))
    assert text.startswith("- pattern1 at 10 tasks/s: **PASS**")
    assert (
        "berth 0.820 vs best baseline least-outstanding 0.710: +0.110 (MET: target +0.10); 95 % CI: berth ±0."
        in text
    )
    assert "least-outstanding ±0.020, the difference ±" in text
    assert "(means of 5 and 5 seeds" in text
    assert "completion: berth 0.950 ±0.000 vs round-robin 0.950 ±0.000: +0.000 (MET)" in text
    assert "translation: berth 0.790 ±0.000 vs least-outstanding 0.800 ±0.000: -0.010 (MET)" in text
    short = seeds("berth", [0.75] * 5, completion=[0.95] * 5, translation=[0.80] * 5)
    assert target_check([*short, *BASE], "pattern1")[0].endswith("**FAIL**")


def test_nothing_to_compare_without_a_baseline() -> None:
    assert verdict(seeds("berth", [0.8]), "pattern1") is None
    assert target_check(seeds("berth", [0.8]), "pattern1") == ["- pattern1: nothing to compare"]
    assert target_check(seeds("berth", [0.8]), "pattern2") == []


def test_day_one_table_judges_each_preset_against_the_best_baseline_and_its_tuned_self() -> None:
    """Every shipped preset in the day-one configuration: at least the best baseline's mean at every rate,
    and within 0.03 of its own tuned configuration at the heaviest rate; a preset is never a baseline
    (the targets of berth compare it with round robin, power of two and least outstanding only)."""
    runs = []
    for seed in (1, 2):
        for rate, day in ((8.0, {"berth": 0.95, "default": 0.93}), (10.0, {"berth": 0.80, "default": 0.70})):
            for policy, g in day.items():
                runs.append(dataclasses.replace(run(policy, g, seed=seed, rate=rate), config="day-one"))
                tuned = {"berth": g + 0.02, "default": g + 0.05}[policy]
                runs.append(run(policy, tuned, seed=seed, rate=rate))
            heavy = rate == 10.0
            for base, g in (
                ("least-outstanding", 0.70 if heavy else 0.94),
                ("round-robin", 0.72 if heavy else 0.9),
            ):
                runs.append(dataclasses.replace(run(base, g, seed=seed, rate=rate), config="day-one"))
                runs.append(run(base, g, seed=seed, rate=rate))
    rows, verdicts = day_one_table(runs, "pattern1")
    cells = {(r[0], r[1]): r for r in rows}
    assert cells[("8", "coding-assistant (berth)")][4] == "+0.010 PASS"
    assert cells[("8", "default")][4] == "-0.010 FAIL"
    assert cells[("8", "default")][5] == "-"  # the tuned comparison is at the heaviest rate only
    assert cells[("10", "coding-assistant (berth)")][3].startswith("round-robin 0.720")
    assert cells[("10", "coding-assistant (berth)")][4] == "+0.080 PASS"
    assert cells[("10", "coding-assistant (berth)")][5].endswith("(-0.020, PASS)")
    assert cells[("10", "default")][4] == "-0.020 FAIL"
    assert cells[("10", "default")][5].endswith("(-0.050, FAIL)")
    assert verdicts.count(False) == 3
    # the presets are not baselines: berth's target is judged against the three baselines only
    v = verdict([r for r in runs if r.config == "day-one"], "pattern1")
    assert v is not None
    assert v.best.policy == "round-robin"
