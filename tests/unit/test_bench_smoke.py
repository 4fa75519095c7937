"""Every benchmark end to end in its smoke form (its smallest configuration) and every preset it lists,
through `berth-loadgen bench NAME`: it exits 0, leaves report.json and report.md, and its last line is a
verdict. The figures of such short runs mean nothing and are not judged. Benchmarks whose smoke run
starts servers or engines run in tests/integration/test_bench_smoke_live.py; the live ones have an
end-to-end test of their own (`Benchmark.live_test`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import orjson
import pytest

from loadgen.bench.catalogue import BENCHMARKS
from loadgen.bench.skeleton import Benchmark
from loadgen.cli import main as loadgen_main

REPO = Path(__file__).resolve().parents[2]


def smoke_cases(*, processes: bool) -> list[pytest.ParameterSet]:
    """(benchmark, extra options) for the smoke form and each preset, with readable ids."""
    cases = []
    for b in BENCHMARKS.values():
        if b.smoke is None or b.processes is not processes:
            continue
        for extra in ((), *b.presets):
            cases.append(pytest.param(b, extra, id=" ".join((b.name, *extra))))
    return cases


def run_smoke(b: Benchmark, extra: tuple[str, ...], out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert b.smoke is not None
    assert loadgen_main(["bench", b.name, *b.smoke, *extra, "--out", str(out)]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    expected = ("verdict: PASS", "verdict: FAIL") if b.targets else ("verdict: none",)
    assert last.startswith(expected), last
    assert isinstance(orjson.loads((out / "report.json").read_bytes()), dict | list)
    assert (out / "report.md").read_text().strip()


@pytest.mark.parametrize(("bench", "extra"), smoke_cases(processes=False))
def test_the_benchmark_runs_to_its_verdict(
    bench: Benchmark, extra: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_smoke(bench, extra, tmp_path / "out", capsys)


@pytest.mark.parametrize("bench", list(BENCHMARKS.values()), ids=list(BENCHMARKS))
def test_every_benchmark_is_run_end_to_end_somewhere(bench: Benchmark) -> None:
    if bench.live_test:
        assert (REPO / bench.live_test).is_file(), bench.live_test
    assert bench.smoke is not None or bench.live_test
    __import__(bench.module)  # its module exists and imports


@pytest.mark.parametrize("bench", list(BENCHMARKS.values()), ids=list(BENCHMARKS))
def test_the_quick_form_it_lists_is_accepted(
    bench: Benchmark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench --list` shows each benchmark's quick form: its options parse and build a configuration the
    benchmark takes (the run itself is replaced)."""
    importlib.import_module(bench.module)
    taken: list[object] = []

    def fake_run_bench(b: Benchmark, cfg: object, *args: object, **kwargs: object) -> int:
        assert not isinstance(cfg, str), cfg  # a refused configuration
        taken.append(cfg)
        return 0

    for name, module in list(sys.modules.items()):
        if name.startswith("loadgen.bench.") and hasattr(module, "run_bench"):
            monkeypatch.setattr(module, "run_bench", fake_run_bench)
    if bench.needs.startswith("the engine venv"):
        monkeypatch.setattr(f"{bench.module}.find_engine_python", lambda: tmp_path / "python")
    assert loadgen_main(["bench", bench.name, *bench.quick, "--out", str(tmp_path / "out")]) == 0
    assert len(taken) == 1


@pytest.mark.parametrize("name", ["vllm", "predict-real"])
def test_without_the_engine_venv_it_says_how_to_build_it(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = BENCHMARKS[name]
    importlib.import_module(bench.module)
    monkeypatch.setattr(f"{bench.module}.find_engine_python", lambda: None)
    monkeypatch.setenv("BERTH_ENGINE_PYTHON", str(tmp_path / "missing"))
    assert loadgen_main(["bench", name, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"berth-loadgen bench {name}: no engine venv" in err
    assert "is not an executable" in err
    assert "make engine-env" in err
