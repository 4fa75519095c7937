"""The systemd backend: each engine is a transient unit `berth-engine-ID.service` made by `systemd-run`.

`KillMode=control-group` puts every process the engine forks in the unit's cgroup and ends them all
with it; output goes to the journal. `--user` is added when the agent does not run as root (the
user's manager then needs lingering: `loginctl enable-linger USER`). A stop signals the whole cgroup
(`systemctl kill`, SIGTERM, the drain timeout, then SIGKILL) and then `systemctl stop`s the unit, so
the drain timeout is the caller's, not a unit property fixed at launch. See systemd/berth-agent.md.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import msgspec.structs

from gateway.agent import procs
from gateway.agent.backends.process import KILL_WAIT_S
from gateway.agent.contract import AgentError, ErrorCode
from gateway.agent.state import InstanceRecord
from gateway.agent.wait import poll_until

#: `systemctl is-active` answers that mean the unit's processes may still run.
_ACTIVE: Final = frozenset({"active", "activating", "deactivating", "reloading", "refreshing"})

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def unit_name(instance_id: str) -> str:
    return f"berth-engine-{instance_id}.service"


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=60)
    except OSError as e:  # no such program: reported like a failed command
        return subprocess.CompletedProcess(list(argv), 127, "", f"cannot run {argv[0]}: {e.strerror or e}")


class SystemdBackend:
    name = "systemd"

    def __init__(
        self, *, user: bool | None = None, properties: Sequence[str] = (), run: Runner = _run
    ) -> None:
        self._user = (os.geteuid() != 0) if user is None else user
        self._properties = tuple(properties)
        self._run = run

    def _scope(self) -> list[str]:
        return ["--user"] if self._user else []

    def launch_argv(self, rec: InstanceRecord, env: Mapping[str, str]) -> list[str]:
        argv = [
            "systemd-run",
            *self._scope(),
            f"--unit={unit_name(rec.id)}",
            f"--description=berth engine {rec.id} ({rec.model})",
            "--collect",
            "--quiet",
            "--property=Type=exec",
            "--property=KillMode=control-group",
            "--property=StandardOutput=journal",
            "--property=StandardError=journal",
            *(f"--property={p}" for p in self._properties),
        ]
        argv += [f"--setenv={k}={v}" for k, v in sorted(env.items())]
        return [*argv, "--", *rec.argv]

    def launch(self, rec: InstanceRecord, env: Mapping[str, str]) -> InstanceRecord:
        unit = unit_name(rec.id)
        self._reset(unit)  # a failed unit of an earlier instance with this id would block the name
        self._call(self.launch_argv(rec, env), rec, ErrorCode.LAUNCH_FAILED)
        pid = self._main_pid(unit)
        started = procs.start_ticks(pid) if pid else None
        return msgspec.structs.replace(rec, unit=unit, pid=pid, pid_start=started)

    def running(self, rec: InstanceRecord) -> bool:
        r = self._run(["systemctl", *self._scope(), "is-active", self._unit(rec)])
        return r.stdout.strip() in _ACTIVE

    def exit_status(self, rec: InstanceRecord) -> int | None:
        if self.running(rec):
            return None
        r = self._run(
            ["systemctl", *self._scope(), "show", "-p", "ExecMainStatus", "--value", self._unit(rec)]
        )
        text = r.stdout.strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def pids(self, rec: InstanceRecord) -> list[int]:
        r = self._run(["systemctl", *self._scope(), "show", "-p", "ControlGroup", "--value", self._unit(rec)])
        cgroup = r.stdout.strip()
        return procs.cgroup_procs(cgroup) if cgroup else []

    def stop(self, rec: InstanceRecord, timeout_s: float) -> bool:
        unit = self._unit(rec)
        killed = False
        if self.running(rec):

            def gone() -> bool:
                return not self.running(rec)

            self._call(
                ["systemctl", *self._scope(), "kill", "--signal=SIGTERM", unit], rec, ErrorCode.BACKEND
            )
            if not poll_until(gone, timeout_s, interval_s=0.2):
                killed = True
                self._call(
                    ["systemctl", *self._scope(), "kill", "--signal=SIGKILL", unit], rec, ErrorCode.BACKEND
                )
                if not poll_until(gone, KILL_WAIT_S, interval_s=0.2):
                    raise AgentError.of(
                        ErrorCode.STOP_FAILED, f"unit {unit} is still active after SIGKILL", instance=rec.id
                    )
        self._run(["systemctl", *self._scope(), "stop", unit])
        self._reset(unit)
        return killed

    def logs(self, rec: InstanceRecord, tail: int) -> tuple[str, list[str]]:
        unit = self._unit(rec)
        argv = ["journalctl", *self._scope(), "-u", unit, "-n", str(tail), "--no-pager", "-o", "cat"]
        r = self._call(argv, rec, ErrorCode.BACKEND)
        return f"journal:{unit}", r.stdout.splitlines()[-tail:] if tail > 0 else []

    @staticmethod
    def _unit(rec: InstanceRecord) -> str:
        """The instance's unit (named by its id: known even if the agent died before recording it)."""
        return rec.unit or unit_name(rec.id)

    def _main_pid(self, unit: str) -> int | None:
        r = self._run(["systemctl", *self._scope(), "show", "-p", "MainPID", "--value", unit])
        text = r.stdout.strip()
        return int(text) if text.isdigit() and int(text) > 0 else None

    def _reset(self, unit: str) -> None:
        self._run(["systemctl", *self._scope(), "reset-failed", unit])

    def _call(
        self, argv: list[str], rec: InstanceRecord, code: ErrorCode
    ) -> subprocess.CompletedProcess[str]:
        try:
            r = self._run(argv)
        except subprocess.TimeoutExpired as e:
            raise AgentError.of(code, f"{argv[0]} failed: {e}", instance=rec.id) from None
        if r.returncode != 0:
            detail = (r.stderr or r.stdout).strip().splitlines()
            raise AgentError.of(
                code,
                f"{' '.join(argv[:3])} ... exited {r.returncode}: {detail[-1] if detail else ''}",
                instance=rec.id,
            )
        return r
