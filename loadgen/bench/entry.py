"""The command-line end of a simulator benchmark: a bad configuration is exit 2 with the reason, Ctrl-C
is 130, and a benchmark that ran to the end exits 0 whatever its verdict (it prints `verdict: PASS` or
`verdict: FAIL` last), so that a scripted run can tell a failed target from a benchmark that could not
run."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

C = TypeVar("C")
R = TypeVar("R")


def say(line: str) -> None:
    """A benchmark's progress line, printed at once."""
    print(line, flush=True)


def config_or_reason(build: Callable[[], C]) -> C | str:
    """`build()`, or the message of the ValueError it raised (a refused configuration, for `run_bench`)."""
    try:
        return build()
    except ValueError as e:
        return str(e)


def run_bench(
    name: str, cfg: C | str, bench: Callable[[C], R], *, passed: Callable[[R], bool] | None = None
) -> int:
    """Run `bench(cfg)`; `cfg` as a string is the reason the configuration was refused. `passed` judges
    the result against the benchmark's targets: its verdict is printed, the exit status stays 0."""
    if isinstance(cfg, str):
        print(f"berth-loadgen bench {name}: {cfg}", file=sys.stderr)
        return 2
    try:
        result = bench(cfg)
    except KeyboardInterrupt:
        return 130
    if passed is not None:
        say(f"verdict: {'PASS' if passed(result) else 'FAIL'}")
    return 0
