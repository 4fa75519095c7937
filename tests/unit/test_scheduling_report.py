"""The scheduling benchmark's target checks: each policy judged on its mean over the seeds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest

from loadgen.bench import scheduling
from loadgen.bench.scheduling_report import floor_lines, policy_means, ratio_fleet, run_row, target_check
from loadgen.bench.scheduling_types import BenchConfig, RunResult

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
    from loadgen.bench.scheduling import merge

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
    ran: list[tuple[str, int, int]] = []

    async def fake_run(
        cfg: BenchConfig, policy: str, *, pattern: str, rate: float, n_a: int, n_b: int
    ) -> RunResult:
        assert (pattern, rate) == (cfg.aladdin_pattern, cfg.aladdin_rate)
        ran.append((policy, n_a, n_b))
        return dataclasses.replace(run(policy, 0.5), endpoints=(n_a, n_b))

    monkeypatch.setattr(scheduling, "run_one", fake_run)
    cfg = BenchConfig(out=tmp_path)
    searched = [dataclasses.replace(run("berth", 0.8), endpoints=(3, 1))]  # the search's own run at 4
    out = await scheduling.at_ratio_fleet(cfg, {"berth": 6, "least-outstanding": 6}, searched, lambda _: None)
    assert ran == [("least-outstanding", 3, 1)]
    assert [r.endpoints for r in out] == [(3, 1)]
    ran.clear()
    no_baseline = {"berth": 6, "least-outstanding": None}
    assert await scheduling.at_ratio_fleet(cfg, no_baseline, [], lambda _: None) == []
    assert ran == []


def test_the_floor_lines_quote_each_policy_on_the_ratio_fleet() -> None:
    there = [
        dataclasses.replace(run("berth", 0.795), endpoints=(3, 1)),
        dataclasses.replace(run("least-outstanding", 0.204), endpoints=(3, 1)),
        dataclasses.replace(run("berth", 0.99), endpoints=(5, 1)),
    ]
    line = floor_lines("pattern1", 6.0, {"berth": 6, "least-outstanding": 6}, there)[1]
    assert line.endswith("; goodput there: berth 0.795, least-outstanding 0.204")
