"""What an overhead run records about itself (`loadgen.bench.overhead.proxy`): how it was made (when,
its options, the commit, the machine, its load at the end) and report.md around the figures' table."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadgen.bench.overhead.overhead_procs import cpu_layout
from loadgen.harness import REPO_ROOT


def run_meta(args: argparse.Namespace, started: float, logdir: Path) -> dict[str, Any]:
    """How the run was made: when, its options, the commit, the machine and its load at the end."""

    def git(*argv: str) -> str:
        try:
            out = subprocess.run(
                ["git", *argv], check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
            )
        except OSError:
            return ""
        return out.stdout.strip()

    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "elapsed_s": round(time.time() - started, 1),
        "options": options,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "cpu_layout": {k: sorted(v) if v is not None else None for k, v in cpu_layout(args.pin).items()},
        "logs": str(logdir),
    }


def markdown(report: dict[str, Any]) -> str:
    """report.md: the table, the verdicts and how the run was made."""
    meta = report["meta"]
    dirty = " (dirty)" if meta["git_dirty"] else ""
    load_avg = ", ".join(f"{x:.2f}" for x in meta["load_avg_at_end"])
    harness = meta["options"].get("harness")
    source = f"the peer harness at {harness}" if harness else "built-in load"
    lines = [
        "# berth overhead benchmark",
        "",
        f"{meta['started_at']}, commit {meta['git_commit'][:12]}{dirty}, {meta['cpus']} CPUs, "
        f"load average at the end {load_avg}; {source}.",
        "",
        "```",
        report["table"],
        "```",
    ]
    for what, why in report["unavailable"].items():
        lines += ["", f"{what} was not measured: {why.splitlines()[0] if why else ''}"]
    return "\n".join(lines) + "\n"
