"""The systemd backend's commands, against fake `systemd-run`, `systemctl` and `journalctl` on PATH.

systemd is not usable in the test container, so the fakes record their argv (one line per call) and
play a unit's life: active once launched, inactive after a `kill` that the unit obeys.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec
import pytest

from gateway.agent.backends.systemd import SystemdBackend, unit_name
from gateway.agent.config import load_agent_config
from gateway.agent.contract import AgentError, ErrorCode, InstanceState
from gateway.agent.node import Agent
from gateway.agent.state import InstanceRecord

FAKE = r"""#!/bin/sh
# Records its argv; plays a unit that is active until it gets a signal it obeys.
echo "$(basename "$0") $*" >> "$FAKE_DIR/calls"
case "$(basename "$0")" in
systemd-run)
    [ -e "$FAKE_DIR/run-fails" ] && { echo "Unit already exists" >&2; exit 1; }
    rm -f "$FAKE_DIR/gone"; exit 0 ;;
journalctl) printf 'line one\nline two\nline three\n'; exit 0 ;;
esac
for a in "$@"; do
  case "$a" in
  is-active) if [ -e "$FAKE_DIR/gone" ]; then echo inactive; exit 3; else echo active; exit 0; fi ;;
  --signal=SIGKILL) touch "$FAKE_DIR/gone"; exit 0 ;;
  --signal=SIGTERM) [ -e "$FAKE_DIR/ignores-term" ] || touch "$FAKE_DIR/gone"; exit 0 ;;
  MainPID) echo 4321; exit 0 ;;
  ControlGroup) echo /system.slice/berth-engine-x.service; exit 0 ;;
  ExecMainStatus) echo 0; exit 0 ;;
  esac
done
exit 0
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("systemd-run", "systemctl", "journalctl"):
        p = bindir / name
        p.write_text(FAKE)
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    return tmp_path


def _calls(fake: Path) -> list[str]:
    p = fake / "calls"
    return p.read_text().splitlines() if p.exists() else []


def _record(**kw: object) -> InstanceRecord:
    base: dict[str, object] = {
        "id": "x",
        "model": "m",
        "engine": "vllm",
        "state": "starting",
        "backend": "systemd",
        "host": "127.0.0.1",
        "url": "http://127.0.0.1:20000",
        "port": 20000,
        "devices": ["gpu0"],
        "device_indices": [0],
        "memory_bytes": 1,
        "argv": ["vllm", "serve", "/m", "--port", "20000"],
        "env": {"CUDA_VISIBLE_DEVICES": "0"},
        "health_path": "/health",
        "started_at": 0.0,
        "load_deadline": 1.0,
    }
    return msgspec.convert({**base, **kw}, InstanceRecord)


@pytest.mark.parametrize(("user", "scope"), [(True, " --user"), (False, "")])
def test_launch_argv(fake: Path, user: bool, scope: str) -> None:
    b = SystemdBackend(user=user, properties=["LimitMEMLOCK=infinity"])
    rec = b.launch(_record(), {"CUDA_VISIBLE_DEVICES": "0", "A": "b c"})
    assert (rec.unit, rec.pid) == ("berth-engine-x.service", 4321)
    assert _calls(fake) == [
        f"systemctl{scope} reset-failed berth-engine-x.service",
        f"systemd-run{scope} --unit=berth-engine-x.service --description=berth engine x (m) --collect --quiet"
        " --property=Type=exec --property=KillMode=control-group --property=StandardOutput=journal"
        " --property=StandardError=journal --property=LimitMEMLOCK=infinity"
        " --setenv=A=b c --setenv=CUDA_VISIBLE_DEVICES=0"
        " -- vllm serve /m --port 20000",
        f"systemctl{scope} show -p MainPID --value berth-engine-x.service",
    ]


def test_launch_failure(fake: Path) -> None:
    (fake / "run-fails").touch()
    with pytest.raises(AgentError) as e:
        SystemdBackend(user=False).launch(_record(), {})
    assert e.value.body.code is ErrorCode.LAUNCH_FAILED
    assert "Unit already exists" in e.value.body.message


def test_stop_terms_the_cgroup_then_stops_the_unit(fake: Path) -> None:
    b = SystemdBackend(user=False)
    rec = _record(unit=unit_name("x"))
    assert b.running(rec)
    assert b.stop(rec, 5.0) is False
    calls = _calls(fake)
    assert calls[:3] == [
        "systemctl is-active berth-engine-x.service",  # running()
        "systemctl is-active berth-engine-x.service",  # stop(): is there anything to stop
        "systemctl kill --signal=SIGTERM berth-engine-x.service",
    ]
    assert calls[-2:] == [
        "systemctl stop berth-engine-x.service",
        "systemctl reset-failed berth-engine-x.service",
    ]
    assert not any("SIGKILL" in c for c in calls)


def test_stop_kills_what_ignores_sigterm_after_the_drain_timeout(fake: Path) -> None:
    (fake / "ignores-term").touch()
    b = SystemdBackend(user=False)
    assert b.stop(_record(unit=unit_name("x")), 0.2) is True
    kills = [c for c in _calls(fake) if " kill " in c]
    assert kills == [
        "systemctl kill --signal=SIGTERM berth-engine-x.service",
        "systemctl kill --signal=SIGKILL berth-engine-x.service",
    ]


def test_logs_and_pids(fake: Path) -> None:
    b = SystemdBackend(user=True)
    source, lines = b.logs(_record(unit=unit_name("x")), 2)
    assert (source, lines) == ("journal:berth-engine-x.service", ["line two", "line three"])
    assert "journalctl --user -u berth-engine-x.service -n 2 --no-pager -o cat" in _calls(fake)
    assert b.pids(_record(unit=unit_name("x"))) == []  # the fake's cgroup does not exist here


def test_the_agent_starts_and_stops_through_systemd(fake: Path) -> None:
    (fake / "models.toml").write_text(
        '[[models]]\nname = "m"\nengine = "vllm"\n'
        'command = ["vllm", "serve", "--port", "{port}"]\nmemory_gib = 1\n'
    )
    (fake / "agent.toml").write_text(
        'state_dir = "state"\nbackend = "systemd"\nrelease_wait_s = 0\nport_range = [27100, 27199]\n'
        '[[devices]]\nname = "gpu0"\nmemory_gib = 8\n'
    )
    cfg = load_agent_config(fake / "agent.toml")
    agent = Agent(cfg, SystemdBackend(user=False), probe=lambda url: True)
    report = agent.start("m", instance_id="x")
    assert (report.instance.unit, report.instance.pid) == ("berth-engine-x.service", 4321)
    assert report.instance.state is InstanceState.READY
    run = next(c for c in _calls(fake) if c.startswith("systemd-run"))
    assert run.endswith(f"--setenv=CUDA_VISIBLE_DEVICES=0 -- vllm serve --port {report.instance.port}")
    (listed,) = agent.instances().instances
    assert (listed.state, listed.healthy) == (InstanceState.READY, True)
    assert agent.stop("x").state is InstanceState.STOPPED
    assert agent.logs("x", tail=1).lines == ["line three"]
