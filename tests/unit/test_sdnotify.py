"""sd_notify against a datagram socket the test owns (a path and an abstract name)."""

from __future__ import annotations

import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from structlog.testing import capture_logs

from gateway.core import sdnotify
from gateway.core.sdnotify import Notifier, watchdog_loop


@dataclass
class Listener:
    sock: socket.socket
    notify_socket: str  # the NOTIFY_SOCKET value systemd would set

    def recv(self) -> bytes:
        # Local AF_UNIX datagrams are queued by the time sendto returns: no waiting needed.
        return self.sock.recv(4096)

    def assert_empty(self) -> None:
        with pytest.raises(BlockingIOError):
            self.sock.recv(4096)


def _bind(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.setblocking(False)
    return sock


@pytest.fixture
def short_dir() -> Iterator[str]:
    # pytest's tmp_path can exceed the 107-byte limit of sun_path.
    with tempfile.TemporaryDirectory(prefix="sdn-") as d:
        yield d


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest, short_dir: str) -> Iterator[Listener]:
    if request.param == "path":
        path = os.path.join(short_dir, "notify")
        lst = Listener(_bind(path), path)
    else:
        name = f"berth-test-{uuid.uuid4().hex}"
        lst = Listener(_bind("\0" + name), "@" + name)
    try:
        yield lst
    finally:
        lst.sock.close()


def _notifier(listener: Listener, **extra: str) -> Notifier:
    return Notifier.from_env({"NOTIFY_SOCKET": listener.notify_socket, **extra})


@pytest.mark.parametrize(
    ("send", "expected"),
    [
        (Notifier.ready, b"READY=1"),
        (Notifier.stopping, b"STOPPING=1"),
        (Notifier.watchdog, b"WATCHDOG=1"),
        (lambda n: n.status("draining 3 requests"), b"STATUS=draining 3 requests"),
        (lambda n: n.status("line one\nline two"), b"STATUS=line one line two"),
        (lambda n: n.notify("READY=1", "STATUS=up"), b"READY=1\nSTATUS=up"),
    ],
    ids=["ready", "stopping", "watchdog", "status", "status-newline", "notify-many"],
)
def test_sends_exact_datagram(listener: Listener, send: Callable[[Notifier], bool], expected: bytes) -> None:
    notifier = _notifier(listener)
    assert notifier.enabled
    assert send(notifier) is True
    assert listener.recv() == expected
    listener.assert_empty()
    notifier.close()


def test_reloading_carries_monotonic_usec(listener: Listener) -> None:
    notifier = _notifier(listener)
    before = sdnotify.monotonic_usec()
    assert notifier.reloading()
    after = sdnotify.monotonic_usec()
    first, second = listener.recv().split(b"\n")
    assert first == b"RELOADING=1"
    key, _, value = second.partition(b"=")
    assert key == b"MONOTONIC_USEC"
    assert before <= int(value) <= after


def test_monotonic_usec_is_clock_monotonic() -> None:
    assert abs(sdnotify.monotonic_usec() / 1e6 - time.clock_gettime(time.CLOCK_MONOTONIC)) < 1.0


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "not-a-pid"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "thirty"}, None),
        ({}, None),
    ],
    ids=["usec", "pid-ours", "pid-other", "pid-garbage", "zero", "negative", "garbage", "unset"],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": "/run/berth-test/notify", **env})
    assert notifier.watchdog_interval_s() == expected


def test_no_watchdog_without_notify_socket() -> None:
    notifier = Notifier.from_env({"WATCHDOG_USEC": "30000000"})
    assert notifier.watchdog_interval_s() is None


@pytest.mark.parametrize(
    "env",
    [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "relative/path"}, {"NOTIFY_SOCKET": "vsock:2:1234"}],
    ids=["unset", "empty", "relative", "vsock"],
)
def test_disabled_is_a_silent_no_op(env: dict[str, str]) -> None:
    notifier = Notifier.from_env(env)
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.reloading() is False
    assert notifier.status("x") is False
    assert notifier.failures == 0


def test_reads_os_environ_by_default(listener: Listener, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", listener.notify_socket)
    assert Notifier.from_env().ready()
    assert listener.recv() == b"READY=1"


@pytest.mark.parametrize("unset", [False, True], ids=["keep", "unset"])
def test_unset_environment(unset: bool) -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid()), "A": "b"}
    notifier = Notifier.from_env(env, unset_environment=unset)
    assert notifier.enabled
    assert notifier.watchdog_interval_s() == 1.0
    expected = {"A"} if unset else {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "A"}
    assert set(env) == expected


def test_dead_socket_never_raises_and_logs_once(short_dir: str) -> None:
    path = os.path.join(short_dir, "gone")
    _bind(path).close()  # bound once, now nobody listens
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    with capture_logs() as logs:
        assert notifier.ready() is False
        assert notifier.watchdog() is False
        assert notifier.stopping() is False
    assert notifier.failures == 3
    assert [e["event"] for e in logs] == ["sd_notify_failed"]
    assert logs[0]["log_level"] == "warning"


def test_missing_socket_path_never_raises(short_dir: str) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": os.path.join(short_dir, "never-existed")})
    assert notifier.enabled
    assert notifier.ready() is False


def test_full_socket_buffer_drops_instead_of_blocking(listener: Listener) -> None:
    notifier = _notifier(listener)
    # Nobody reads: the receive queue fills up and sendto would block; it must fail fast instead.
    sent = 0
    while sent < 100_000 and notifier.status("x" * 1024):
        sent += 1
    assert 0 < sent < 100_000
    assert notifier.failures == 1


class _StopLoop(Exception):
    pass


async def test_watchdog_loop_pings_every_half_interval(listener: Listener) -> None:
    notifier = _notifier(listener, WATCHDOG_USEC="10000000")
    waits: list[float] = []

    async def fake_wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            raise _StopLoop

    with pytest.raises(_StopLoop):
        await watchdog_loop(notifier, wait=fake_wait)
    assert waits == [5.0, 5.0, 5.0]
    assert [listener.recv() for _ in range(3)] == [b"WATCHDOG=1"] * 3
    listener.assert_empty()


@pytest.mark.parametrize(
    "env",
    [{"NOTIFY_SOCKET": "/run/x"}, {"WATCHDOG_USEC": "1000000"}],
    ids=["no-watchdog", "no-socket"],
)
async def test_watchdog_loop_returns_without_watchdog(env: dict[str, str]) -> None:
    async def fail_wait(seconds: float) -> None:
        raise AssertionError("must not wait")

    await watchdog_loop(Notifier.from_env(env), wait=fail_wait)
