"""What a benchmark's command-line end uses beside the skeleton (`loadgen.bench.skeleton.run_bench`): its
progress lines, and a configuration refused with a reason rather than a traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

C = TypeVar("C")


def say(line: str) -> None:
    """A benchmark's progress line, printed at once."""
    print(line, flush=True)


def config_or_reason(build: Callable[[], C]) -> C | str:
    """`build()`, or the message of the ValueError it raised (a refused configuration, for `run_bench`)."""
    try:
        return build()
    except ValueError as e:
        return str(e)
