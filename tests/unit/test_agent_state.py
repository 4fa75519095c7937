"""Instance records (atomic, before launch), the node lock, and process identity from /proc."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from gateway.agent import procs
from gateway.agent.backends import INSTANCE_ENV, instance_marker
from gateway.agent.backends.process import ProcessBackend
from gateway.agent.contract import InstanceState
from gateway.agent.state import InstanceRecord, StateDir
from gateway.agent.wait import poll_until


def _rec(instance_id: str, state: InstanceState = InstanceState.STARTING) -> InstanceRecord:
    return InstanceRecord(
        id=instance_id,
        model="m",
        engine="vllm",
        state=state,
        backend="process",
        host="127.0.0.1",
        url="http://127.0.0.1:1",
        port=1,
        devices=("gpu0",),
        device_indices=(0,),
        memory_bytes=1,
        argv=("x",),
        env={},
        health_path="/health",
        started_at=1.0,
        load_deadline=2.0,
    )


def test_records_round_trip_and_replace_atomically(tmp_path: Path) -> None:
    s = StateDir(tmp_path / "state")
    s.write(_rec("a"))
    s.write(msgspec.structs.replace(_rec("a"), state=InstanceState.READY))
    s.write(_rec("b"))
    (s.instances / ".c.json.tmp").write_text("{half")  # an interrupted write
    (s.instances / "junk.json").write_text("not json")
    assert [(r.id, r.state) for r in s.records()] == [
        ("a", InstanceState.READY),
        ("b", InstanceState.STARTING),
    ]
    a = s.read("a")
    assert a is not None
    assert a.resident
    assert s.read("../a") is None
    assert oct(s.path.stat().st_mode & 0o777) == oct(0o750)
    assert oct((s.instances / "a.json").stat().st_mode & 0o777) == oct(0o640)


def test_the_lock_excludes_other_invocations(tmp_path: Path) -> None:
    s = StateDir(tmp_path / "state")
    with s.lock():
        fd = os.open(s.path / "lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(s.path / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again once released
    finally:
        os.close(fd)


def test_process_identity_includes_its_start_time() -> None:
    me = os.getpid()
    started = procs.start_ticks(me)
    assert started is not None
    assert procs.alive(me, started)
    assert not procs.alive(me, started + 1)  # the same pid, another process: not ours


def test_group_members_and_zombies() -> None:
    code = "import subprocess, sys; subprocess.Popen(['sleep', '60']); sys.stdin.read()"
    leader = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, start_new_session=True)
    try:
        since = procs.start_ticks(leader.pid) or 0
        assert poll_until(lambda: len(procs.group_members(leader.pid, since_ticks=since)) == 2, 10)
        assert procs.cpu_ticks(procs.group_members(leader.pid)) >= 0
    finally:
        os.killpg(leader.pid, 9)
    # Unreaped, the leader is a zombie: gone as far as the agent is concerned.
    assert poll_until(lambda: procs.group_members(leader.pid) == [], 10)
    assert not procs.alive(leader.pid, since)
    leader.wait()


def test_an_engine_whose_pid_was_never_recorded_is_found_by_its_marker(tmp_path: Path) -> None:
    """The agent died between launching an engine and recording its pid: the next one still ends it."""
    code = "import subprocess, sys; subprocess.Popen(['sleep', '60']); sys.stdin.read()"
    env = {**os.environ, INSTANCE_ENV: "lost-1"}
    engine = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        backend = ProcessBackend(tmp_path)
        rec = _rec("lost-1")  # pid None
        assert not backend.running(rec)
        assert poll_until(lambda: len(backend.pids(rec)) == 2, 10)  # the engine and its child
        assert backend.pids(_rec("other")) == []
        assert backend.stop(rec, 5.0) is False  # SIGTERM was enough
        assert backend.pids(rec) == []
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, 9)
        engine.wait()


def test_another_agents_engine_of_the_same_id_is_left_alone(tmp_path: Path) -> None:
    """Two agents on one machine (two state directories) may both run an instance `m-1` (a gateway names
    them `<model>-<n>`): each finds and stops only its own by the marker."""
    mine, theirs = (instance_marker(tmp_path / d, "m-1") for d in ("a", "b"))
    assert mine != theirs
    code = "import sys; sys.stdin.read()"
    other = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        env={**os.environ, INSTANCE_ENV: theirs},
        start_new_session=True,
    )
    try:
        backend = ProcessBackend(tmp_path)
        theirs_rec = msgspec.structs.replace(_rec("m-1"), env={INSTANCE_ENV: theirs})
        assert poll_until(lambda: backend.pids(theirs_rec) == [other.pid], 10)  # found by its marker
        rec = msgspec.structs.replace(_rec("m-1"), env={INSTANCE_ENV: mine})  # pid never recorded
        assert backend.pids(rec) == []
        assert backend.stop(rec, 0.0) is False
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_reused_pid_is_not_taken_for_the_engine(tmp_path: Path) -> None:
    """The engine's pid (and so its group id) now belongs to another process group: leave it alone."""
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started = procs.start_ticks(other.pid)
        assert started is not None
        backend = ProcessBackend(tmp_path)
        rec = msgspec.structs.replace(_rec("old-1"), pid=other.pid, pid_start=started - 1)
        assert not backend.running(rec)
        assert backend.pids(rec) == []
        assert backend.stop(rec, 0.0) is False
        assert procs.alive(other.pid, started)
    finally:
        other.kill()
        other.wait()
