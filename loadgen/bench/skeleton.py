"""One skeleton for every benchmark: options -> runs -> `OUT/report.json`, `OUT/report.md` (and plots) -> a
verdict against the targets it states.

A benchmark is described once (`Benchmark`: its name, the question it answers, its targets, its quick and
smoke forms) in `loadgen.bench.catalogue`, and its `main(argv)` ends in `run_bench`, which holds the
command-line contract every benchmark keeps:

- a configuration the benchmark refuses is exit 2 with the reason (on stderr);
- a run that could not go on (a server that did not start, a missing tool) is exit 1 with the reason;
- Ctrl-C is exit 130;
- a benchmark that ran to the end exits 0 whatever its verdict, after `report.json` and `report.md` are
  in its output directory and `verdict: PASS` or `verdict: FAIL` (or, for a benchmark that states no
  target, `verdict: none`) is its last line, so that a scripted run can tell a failed target from a
  benchmark that could not run.

A benchmark writes its own reports (most do, with their plots), or hands `run_bench` a `report` function
that turns its result into the two (a JSON document and its markdown).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import orjson

C = TypeVar("C")
R = TypeVar("R")

#: What a benchmark's `report` function returns: report.json's document and report.md's text.
Report = tuple[Mapping[str, Any], str]

REPORT_JSON: Final = "report.json"
REPORT_MD: Final = "report.md"
GROUPS: Final = ("overhead", "scheduling", "lifecycle", "simulator", "reliability")


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One benchmark as `berth-loadgen bench --list` shows it and the smoke test runs it."""

    name: str  # `berth-loadgen bench NAME`
    group: str  # the package it lives in (`GROUPS`): the kind of question
    question: str  # the question it answers, one sentence
    targets: tuple[str, ...]  # what its verdict judges, one line each; () for a benchmark of figures only
    module: str  # its module, whose `main(argv) -> int` is the entry
    quick: tuple[str, ...] = ("--quick",)  # the options of its quick form (without --out)
    # The suite's smallest run of it (without --out), or None for a live benchmark whose end-to-end run is
    # the integration test named in `live_test` (real processes, peers or engines) or that `needs` what
    # the suite does not have.
    smoke: tuple[str, ...] | None = None
    # Every further form it lists (its presets, --live, ...): each one also runs in the suite, as the
    # smoke options plus these.
    presets: tuple[tuple[str, ...], ...] = ()
    live_test: str = ""  # tests/...py: the end-to-end run of a live benchmark (real processes)
    processes: bool = False  # its smoke run starts servers or engines (the integration tier runs it)
    needs: str = ""  # what it needs beyond this checkout (redis-server, the engine venv, the peer harness)

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"benchmark {self.name}: group {self.group!r} is not one of {', '.join(GROUPS)}")
        if self.smoke is None and not (self.live_test or self.needs):
            raise ValueError(f"benchmark {self.name}: no smoke form, no live test and nothing it needs")


class Catalogue(Mapping[str, Benchmark]):
    """Benchmarks by name, in the order given; a name given twice is an error."""

    def __init__(self, benchmarks: tuple[Benchmark, ...]) -> None:
        self._by_name: dict[str, Benchmark] = {}
        for b in benchmarks:
            if b.name in self._by_name:
                raise ValueError(f"benchmark {b.name} is registered twice")
            self._by_name[b.name] = b

    def __getitem__(self, name: str) -> Benchmark:
        return self._by_name[name]

    def __iter__(self) -> Any:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def listing(self) -> str:
        """`bench --list`: each benchmark under its group with its question."""
        lines: list[str] = []
        width = max(len(n) for n in self._by_name)
        for group in GROUPS:
            members = [b for b in self._by_name.values() if b.group == group]
            if not members:
                continue
            lines.append(f"{group}:")
            for b in members:
                lines.append(f"  {b.name:<{width}}  {b.question}")
                quick = " ".join((f"berth-loadgen bench {b.name}", *b.quick, "--out DIR"))
                lines.append(f"  {'':<{width}}  quick: {quick}")
        return "\n".join(lines)


def write_report(out: Path, doc: Mapping[str, Any], markdown: str) -> None:
    """`OUT/report.json` (indented, numpy values as lists) and `OUT/report.md`."""
    out.mkdir(parents=True, exist_ok=True)
    options = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    (out / REPORT_JSON).write_bytes(orjson.dumps(doc, option=options) + b"\n")
    (out / REPORT_MD).write_text(markdown if markdown.endswith("\n") else markdown + "\n")


def _out_attribute(cfg: Any) -> Path:
    out: Path = cfg.out
    return out


def run_bench(
    bench: Benchmark,
    cfg: C | str,
    run: Callable[[C], R],
    *,
    passed: Callable[[R], bool] | None = None,
    report: Callable[[R], Report] | None = None,
    out_of: Callable[[C], Path] = _out_attribute,
    failures: tuple[type[Exception], ...] = (),
) -> int:
    """Run `run(cfg)` as `bench`; `cfg` as a string is the reason the configuration was refused. The
    reports go to `out_of(cfg)` (by default the configuration's `out`): `report` writes the result's there
    (a benchmark that writes its own passes none). `passed` judges the result against the benchmark's
    targets: its verdict is printed, the exit status stays 0. One of `failures` raised by the run means it
    could not run to the end: exit 1 with its message."""
    if isinstance(cfg, str):
        print(f"berth-loadgen bench {bench.name}: {cfg}", file=sys.stderr)
        return 2
    out = out_of(cfg)
    try:
        result = run(cfg)
    except KeyboardInterrupt:
        return 130
    except failures as e:
        print(f"berth-loadgen bench {bench.name}: could not run: {e}", file=sys.stderr)
        return 1
    if report is not None:
        write_report(out, *report(result))
    missing = [f for f in (REPORT_JSON, REPORT_MD) if not (out / f).is_file()]
    if missing:
        raise RuntimeError(f"benchmark {bench.name} wrote no {' and no '.join(missing)} in {out}")
    print(f"report: {out / REPORT_MD}", flush=True)
    if passed is None or not bench.targets:
        print("verdict: none (this benchmark states no target: figures only)", flush=True)
    else:
        print(f"verdict: {'PASS' if passed(result) else 'FAIL'}", flush=True)
    return 0
