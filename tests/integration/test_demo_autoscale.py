"""`berth demo --autoscale --no-serve` runs end to end: a real agent starts engines as the burst comes,
the closing table says what was started and stopped and why, and no engine outlives the demo."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from loadgen.demo_autoscale import MARKER_ENV
from loadgen.harness import free_port


def _processes_marked(value: str) -> list[int]:
    """Pids of this user's processes whose environment has MARKER_ENV=value."""
    marker = f"{MARKER_ENV}={value}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if marker in env.split(b"\0"):
            out.append(int(entry.name))
    return out


def _left_behind(directory: str) -> tuple[bool, list[int]]:
    return os.path.exists(directory), _processes_marked(directory)


async def test_demo_autoscale_starts_engines_reports_why_and_leaves_nothing_behind() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "demo",
        "--autoscale",
        "--duration",
        "12",
        "--no-serve",
        "--port",
        str(free_port()),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    text = out.decode()
    assert proc.returncode == 0, err.decode()[-2000:] + text[-2000:]
    found = re.search(r"node agent: (\S+)", text)
    assert found is not None, text
    started = re.search(r"instances started: (\d+) by the autoscaler", text)
    assert started is not None, text
    assert int(started.group(1)) >= 1
    assert "instances stopped:" in text
    assert "(overall)" in text
    assert text.rstrip().endswith("demo stopped")
    assert _left_behind(found.group(1)) == (False, [])  # neither its directory nor an engine of it
