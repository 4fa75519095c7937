"""The sd_notify protocol, without libsystemd: tell systemd we are ready, reloading, stopping, alive.

systemd passes the address of its notification socket in `NOTIFY_SOCKET`: a filesystem path, or an
abstract-namespace name written `@name`. A message is one AF_UNIX datagram of newline-separated
`KEY=value` assignments. Sending is best effort: a notifier never raises into the daemon and never
blocks the event loop (the socket is non-blocking; a full socket buffer drops the message, which the
next watchdog ping makes up for). The first failure is logged once; later ones are counted only.

How the daemon uses it (berth.service is `Type=notify`, `NotifyAccess=main`, `WatchdogSec=`):

- `ready()` once the listener is bound and the app is ready to serve, and again after each reload;
- `reloading()` when SIGHUP starts a reload (`RELOADING=1` with `MONOTONIC_USEC=`, which
  `Type=notify-reload` requires since systemd 253 and plain `Type=notify` ignores), then `ready()`;
- `stopping()` when a graceful drain begins;
- `status(text)` for the one-line state shown by `systemctl status`;
- `watchdog_loop(notifier)` spawned through the TaskSupervisor: it pings from the event loop itself,
  so a wedged loop stops the pings and systemd restarts the service, which is the point.

`NotifyAccess=main` means only the main process may send; do not send from forked helpers.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Final

import structlog

log = structlog.get_logger("berth.sdnotify")

NOTIFY_SOCKET: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC: Final = "WATCHDOG_USEC"
WATCHDOG_PID: Final = "WATCHDOG_PID"


def _socket_address(raw: str) -> str | None:
    """The address to `sendto`, or None for one we cannot use (empty, relative, vsock:...)."""
    if raw.startswith("@") and len(raw) > 1:
        return "\0" + raw[1:]  # abstract namespace: a leading NUL byte instead of the "@"
    if raw.startswith("/"):
        return raw
    return None


def _watchdog_usec(environ: MutableMapping[str, str], pid: int) -> int | None:
    """WATCHDOG_USEC as a positive integer, if it is meant for this process (sd_watchdog_enabled)."""
    raw_usec = environ.get(WATCHDOG_USEC)
    if raw_usec is None:
        return None
    try:
        usec = int(raw_usec)
    except ValueError:
        return None
    if usec <= 0:
        return None
    raw_pid = environ.get(WATCHDOG_PID)
    if raw_pid is not None:
        try:
            if int(raw_pid) != pid:
                return None  # the watchdog belongs to another process (e.g. our parent)
        except ValueError:
            return None
    return usec


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares MONOTONIC_USEC against."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Notifier:
    """Sends sd_notify messages to one socket; every method is a no-op when `enabled` is False."""

    __slots__ = ("_address", "_failures", "_sock", "_watchdog_usec")

    def __init__(self, address: str | None, *, watchdog_usec: int | None = None) -> None:
        """`address` as `sendto` takes it (abstract names start with NUL), or None to disable."""
        self._address = address
        self._watchdog_usec = watchdog_usec if address is not None else None
        self._sock: socket.socket | None = None
        self._failures = 0

    @classmethod
    def from_env(
        cls, environ: MutableMapping[str, str] | None = None, *, unset_environment: bool = False
    ) -> Notifier:
        """Read NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (from `os.environ` by default).

        With `unset_environment=True` the three variables are removed afterwards, as libsystemd's
        `sd_notify(unset_environment=1)` does, so child processes do not inherit them.
        """
        env: MutableMapping[str, str] = os.environ if environ is None else environ
        raw = env.get(NOTIFY_SOCKET)
        address = _socket_address(raw) if raw else None
        if raw and address is None:
            log.warning("sd_notify_unsupported_socket", notify_socket=raw)
        watchdog_usec = _watchdog_usec(env, os.getpid())
        if unset_environment:
            for key in (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID):
                env.pop(key, None)
        return cls(address, watchdog_usec=watchdog_usec)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def failures(self) -> int:
        """How many messages could not be sent."""
        return self._failures

    def notify(self, *assignments: str) -> bool:
        """Send `KEY=value` assignments as one datagram; True if it was handed to the kernel."""
        if self._address is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # close-on-exec by default
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(message, self._address)
        except OSError as exc:
            self._failures += 1
            if self._failures == 1:
                log.warning(
                    "sd_notify_failed",
                    notify_socket=self._address.replace("\0", "@", 1),
                    error=repr(exc),
                    note="further failures are not logged",
                )
            return False
        return True

    def ready(self) -> bool:
        return self.notify("READY=1")

    def reloading(self) -> bool:
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        # A newline would start a new assignment; systemd shows one line anyway.
        return self.notify("STATUS=" + " ".join(text.splitlines()))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def watchdog_interval_s(self) -> float | None:
        """The watchdog timeout systemd set for us (WatchdogSec=), or None if there is none."""
        return None if self._watchdog_usec is None else self._watchdog_usec / 1_000_000

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


async def watchdog_loop(
    notifier: Notifier, *, wait: Callable[[float], Awaitable[object]] = asyncio.sleep
) -> None:
    """Ping the watchdog every half interval until cancelled; returns at once if there is no watchdog.

    `wait` is injected so tests can drive the loop without sleeping.
    """
    interval_s = notifier.watchdog_interval_s()
    if interval_s is None or not notifier.enabled:
        return
    period_s = interval_s / 2
    log.debug("sd_watchdog_started", period_s=period_s)
    while True:
        notifier.watchdog()
        await wait(period_s)
