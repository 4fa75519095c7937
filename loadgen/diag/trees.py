"""`--tree NAME=DIR`: a berth checkout to measure beside others (the A/B benchmarks' shared argument)."""

from __future__ import annotations

import argparse
from pathlib import Path


def tree_arg(text: str) -> tuple[str, Path]:
    """`NAME=DIR`, or `DIR` alone (named after its folder), as (name, resolved path); a folder that is
    not a berth checkout is refused as an argument error."""
    name, sep, path = text.partition("=")
    tree = Path(path if sep else text).resolve()
    if not sep:
        name = tree.name or "berth"
    if not (tree / "gateway" / "cli.py").exists():
        raise argparse.ArgumentTypeError(f"{tree} is not a berth checkout (no gateway/cli.py)")
    return name, tree
