"""A scratch copy of this checkout with the scheduler core compiled by mypyc, to measure what compiling
buys (`overhead_micro` and `overhead_profile` take it as a `--tree`). Not a build berth ships.

    python -m venv /tmp/mypyc-venv && /tmp/mypyc-venv/bin/pip install 'mypy[mypyc]' setuptools
    python -m loadgen.bench.compiled_tree --mypyc /tmp/mypyc-venv/bin/mypyc --out /tmp/berth-mypyc
    python -m loadgen.bench.overhead_micro --tree py=. --tree mypyc=/tmp/berth-mypyc

The copy is `git archive HEAD` (committed files only). mypyc compiles `MODULES` in place (a `.so` beside
each `.py`; Python imports the extension first); the rest stays interpreted, plugins included. Two
modules of `gateway/sched` are left out because mypyc cannot compile them as they are: `interfaces.py`
(its `@runtime_checkable` Protocols become native classes, which `typing` refuses) and `decisions.py`
(a dataclass field annotated `Exception` under `from __future__ import annotations` fails to resolve at
import: KeyError 'Exception'). The package's own pyproject.toml is moved aside during the build
(setuptools, which mypyc drives, would otherwise read berth's project table and refuse its flat layout).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from loadgen.harness import REPO_ROOT

MODULES: Final = tuple(
    f"gateway/sched/{m}.py"
    for m in (
        "admission", "fleet", "predict", "profile", "queues", "request", "running", "scheduler",
        "snapshot", "types",
    )
)  # fmt: skip


def build(mypyc: Path, out: Path, modules: Sequence[str] = MODULES) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO_ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    project = out / "pyproject.toml"
    aside = out / "pyproject.toml.aside"
    project.rename(aside)
    try:
        # --python-executable: type-check against the interpreter that runs berth (its packages' types).
        subprocess.run([str(mypyc), "--python-executable", sys.executable, *modules], cwd=out, check=True)
    finally:
        aside.rename(project)
    shutil.rmtree(out / "build", ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadgen.bench.compiled_tree", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--mypyc", type=Path, required=True, help="the mypyc of a throwaway venv")
    p.add_argument("--out", type=Path, required=True, help="the scratch checkout to make (replaced)")
    args = p.parse_args(argv)
    build(args.mypyc, args.out.resolve())
    print(f"compiled: {args.out} ({len(MODULES)} modules of gateway/sched)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
