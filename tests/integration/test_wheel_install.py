"""The install steps of systemd/README.md install berth: a wheel built from this checkout, installed into a
fresh virtualenv, gives working `berth` commands (and the distribution is `berth-gateway`, not the
unrelated `berth` on PyPI)."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


def test_a_wheel_built_from_the_checkout_installs_working_commands(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, REPO)
    assert built.returncode == 0, built.stderr
    wheels = list(dist.glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["berth_gateway"], wheels

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    installed = _run(bin_dir / "python", "-m", "pip", "install", "-q", wheels[0])
    if installed.returncode != 0 and "No matching distribution" in installed.stderr:
        pytest.skip(f"the package index cannot be reached for the dependencies: {installed.stderr[-300:]}")
    assert installed.returncode == 0, installed.stderr

    shown = _run(bin_dir / "python", "-m", "pip", "show", "berth-gateway")
    assert "Name: berth-gateway" in shown.stdout
    version = _run(bin_dir / "berth", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("berth "), version.stdout
    # `berth check` on the shipped example config (and the policy it names), run outside the checkout
    checked = _run(bin_dir / "berth", "check", "-c", REPO / "conf" / "gateway.toml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok (gateway config" in checked.stdout
    for command in ("berth-agent", "berth-engine-sim", "berth-loadgen"):
        helped = _run(bin_dir / command, "--help")
        assert helped.returncode == 0, (command, helped.stderr)
