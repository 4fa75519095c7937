"""`berth demo --no-serve` runs end to end: fleet, gateway, workload, table, clean exit."""

from __future__ import annotations

import asyncio
import sys

from loadgen.harness import free_port


async def test_demo_runs_and_prints_the_class_table() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "demo",
        "--duration",
        "3",
        "--rate",
        "3",
        "--no-serve",
        "--no-compare",
        "--port",
        str(free_port()),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    text = out.decode()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert "interactive" in text
    assert "(overall)" in text
    assert "demo stopped" in text
