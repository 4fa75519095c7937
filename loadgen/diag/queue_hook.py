"""The overhead benchmark's standing-queue phase (`bench overhead --tests queue --configs berth`) with
berth's process alone under a hook module, for the diagnostics that watch the live daemon from inside
(`diag gc-census`, `diag slow-calls`): an interpreter script for the benchmark's `--python` that runs
`-m gateway.cli ...` as `-m HOOK ARGS... gateway.cli ...` and anything else (the engines, the bare proxy)
as it is; and a command line's own arguments split from those after `--`, which go to the benchmark."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from loadgen.bench.overhead.proxy import main as bench_main


def split_args(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """`argv` (the process's own by default) as the diagnostic's arguments and the benchmark's (after
    `--`)."""
    own = list(sys.argv[1:] if argv is None else argv)
    if "--" not in own:
        return own, []
    cut = own.index("--")
    return own[:cut], own[cut + 1 :]


def hooked_python(path: Path, hook: str, *hook_args: str) -> Path:
    """Write at `path` an interpreter for `--python`: `-m gateway.cli ...` under `-m hook *hook_args`,
    anything else as is."""
    py = shlex.quote(sys.executable)
    args = " ".join(shlex.quote(a) for a in hook_args)
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "gateway.cli" ]; then\n'
        f'  shift 2; exec {py} -m {hook} {args} gateway.cli "$@"\n'
        "fi\n"
        f'exec {py} "$@"\n'
    )
    path.chmod(0o755)
    return path


def run_queue(python: Path, out: Path, bench_args: Sequence[str]) -> None:
    """The standing-queue phase with berth alone, its interpreter `python`, its report under `out`."""
    bench_main([
        "--tests", "queue", "--configs", "berth", "--python", str(python), "--out", str(out),
        *bench_args,
    ])  # fmt: skip
