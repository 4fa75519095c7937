"""systemd/berth.service: the keys the sd_notify integration and the sandbox rely on."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "berth.service"

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """systemd's INI dialect: repeated keys accumulate, `\\` continues a line, # and ; comment."""
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"assignment outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("ExecStart", "/usr/local/bin/berth serve -c /etc/berth/gateway.toml"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("WatchdogSec", "30"),
        ("Restart", "on-failure"),
        ("TimeoutStopSec", "45"),
        ("KillSignal", "SIGTERM"),
        ("User", "berth"),
        ("Group", "berth"),
        ("StateDirectory", "berth"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
        ("CapabilityBoundingSet", ""),
        ("ReadOnlyPaths", "/etc/berth"),
        ("LimitNOFILE", "65536"),
    ],
    ids=lambda v: str(v) or "empty",
)
def test_service_key(unit: Unit, key: str, value: str) -> None:
    assert unit["Service"][key] == [value]


def test_environment(unit: Unit) -> None:
    assert "PYTHONUNBUFFERED=1" in unit["Service"]["Environment"]


def test_drain_fits_in_stop_timeout(unit: Unit) -> None:
    # The watchdog pings every WatchdogSec/2; the stop timeout must exceed a 30 s drain.
    assert int(unit["Service"]["TimeoutStopSec"][0]) > 30


def test_install_and_ordering(unit: Unit) -> None:
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    assert "network-online.target" in unit["Unit"]["After"][0].split()


def test_parser_accumulates_and_continues() -> None:
    parsed = parse_unit("[S]\n# c\nA=1\nA=2\nB=x \\\n  y\n; c\nC=\n")
    assert parsed["S"] == {"A": ["1", "2"], "B": ["x y"], "C": [""]}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart's binary exists; berth is not installed at /usr/local/bin here.
    text = UNIT.read_text().replace("ExecStart=/usr/local/bin/berth ", "ExecStart=/bin/true ")
    copy = tmp_path / "berth.service"
    copy.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""
