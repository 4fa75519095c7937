"""The skeleton every benchmark ends in: its exit status says whether it ran, not whether its targets
passed; a run that ran leaves report.json and report.md and prints its verdict last."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.entry import config_or_reason
from loadgen.bench.skeleton import Benchmark, Catalogue, run_bench
from loadgen.cli import main as loadgen_main

DEMO = Benchmark(
    name="demo", group="overhead", question="Does it?", targets=("it does",), module="x", smoke=()
)
FIGURES = Benchmark(name="figures", group="simulator", question="How much?", targets=(), module="x", smoke=())


class Cfg:
    def __init__(self, out: Path, value: int) -> None:
        self.out = out
        self.value = value


@pytest.mark.parametrize("verdict", [True, False], ids=["pass", "fail"])
def test_a_benchmark_that_ran_exits_0_writes_its_reports_and_prints_its_verdict(
    verdict: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_bench(
        DEMO,
        Cfg(tmp_path, 3),
        lambda c: c.value * 2,
        passed=lambda r: (r == 6) is verdict,
        report=lambda r: ({"doubled": r}, "# demo\n"),
    )
    assert code == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("verdict: PASS" if verdict else "verdict: FAIL")
    assert orjson.loads((tmp_path / "report.json").read_bytes()) == {"doubled": 6}
    assert (tmp_path / "report.md").read_text() == "# demo\n"


def test_a_benchmark_of_figures_only_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(FIGURES, Cfg(tmp_path, 1), lambda c: c.value, report=lambda r: ({}, "")) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("verdict: none")


def test_a_benchmark_that_forgets_its_reports_is_a_bug(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"wrote no report\.json and no report\.md"):
        run_bench(DEMO, Cfg(tmp_path, 1), lambda c: c.value, passed=lambda r: True)


def test_a_refused_configuration_exits_2_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    def build() -> Cfg:
        raise ValueError("--rates must be positive")

    cfg = config_or_reason(build)
    assert run_bench(DEMO, cfg, lambda c: c) == 2
    assert "berth-loadgen bench demo: --rates must be positive" in capsys.readouterr().err


def test_a_run_that_could_not_go_on_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def bench(_: Cfg) -> int:
        raise OSError("redis-server: not found")

    assert run_bench(DEMO, Cfg(tmp_path, 1), bench, failures=(OSError,)) == 1
    assert "could not run: redis-server: not found" in capsys.readouterr().err


def test_an_interrupted_benchmark_exits_130(tmp_path: Path) -> None:
    def bench(_: Cfg) -> int:
        raise KeyboardInterrupt

    assert run_bench(DEMO, Cfg(tmp_path, 1), bench) == 130


def test_a_name_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        Catalogue((DEMO, DEMO))


def test_a_benchmark_without_a_smoke_form_names_its_end_to_end_test() -> None:
    with pytest.raises(ValueError, match="no smoke form"):
        Benchmark(name="x", group="overhead", question="?", targets=(), module="x")
    with pytest.raises(ValueError, match="group"):
        Benchmark(name="x", group="misc", question="?", targets=(), module="x", smoke=())


def test_bench_list_shows_every_benchmark_with_its_question(capsys: pytest.CaptureFixture[str]) -> None:
    assert loadgen_main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for b in BENCHMARKS.values():
        assert f"  {b.name} " in out
        assert b.question in out


def test_an_unknown_benchmark_or_diagnostic_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert loadgen_main(["bench", "nope"]) == 2
    assert loadgen_main(["diag", "nope"]) == 2
    assert "berth-loadgen bench --list" in capsys.readouterr().err


def test_diag_list_shows_every_diagnostic(capsys: pytest.CaptureFixture[str]) -> None:
    from loadgen.diag.catalogue import DIAGNOSTICS

    assert loadgen_main(["diag", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in DIAGNOSTICS)
