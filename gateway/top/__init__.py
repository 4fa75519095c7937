"""`berth top`: a live terminal view of the fleet (endpoints, performance models, queues, SLO
attainment over the last minute), drawn from the gateway's `GET /admin/fleet`.

Plain ANSI, no curses: it works over SSH and in any terminal. It redraws every `--interval` seconds;
`q` or Ctrl-C exits. `--once` prints one frame without escape codes and exits (scripts, tests); it
exits 1 when the gateway cannot be read. The admin token comes from `--token` or BERTH_ADMIN_TOKEN;
without one, the gateway answers loopback clients only.

The frame's text is `tables.render`; this module reads the gateway and runs the loop.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any, Final, TextIO

from gateway.core.admin_read import AdminReadError, read_admin
from gateway.top.tables import render

DEFAULT_URL: Final = "http://127.0.0.1:8080"
FLEET_PATH: Final = "/admin/fleet"
_CLEAR: Final = "\x1b[H\x1b[2J"
_HIDE_CURSOR: Final = "\x1b[?25l"
_SHOW_CURSOR: Final = "\x1b[?25h"

__all__ = ["DEFAULT_URL", "FLEET_PATH", "AdminReadError", "fetch", "render", "run"]


def fetch(url: str, token: str | None, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """The /admin/fleet document of the gateway at `url`."""
    return read_admin(url, FLEET_PATH, token, timeout_s=timeout_s)


# --------------------------------------------------------------------- the loop
def run(
    url: str, token: str | None, *, once: bool, interval_s: float = 1.0, out: TextIO | None = None
) -> int:
    out = out or sys.stdout
    if once:
        try:
            doc = fetch(url, token)
        except AdminReadError as e:
            print(f"berth top: {e}", file=sys.stderr)
            return 1
        out.write(render(doc, url=url))
        out.flush()
        return 0
    with _keys() as key_pressed:
        out.write(_HIDE_CURSOR)
        try:
            while True:
                try:
                    frame = render(fetch(url, token), url=url, color=True)
                except AdminReadError as e:
                    frame = f"berth top: {e}\n(retrying every {interval_s:g}s; q quits)\n"
                width = shutil.get_terminal_size().columns
                # lines with escape codes are short section titles; the rest are clipped to the screen
                clipped = "\n".join(line if "\x1b" in line else line[:width] for line in frame.split("\n"))
                out.write(_CLEAR + clipped)
                out.flush()
                if key_pressed(interval_s) in ("q", "Q"):
                    return 0
        except KeyboardInterrupt:
            return 0
        finally:
            out.write(_SHOW_CURSOR + "\n")
            out.flush()


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """A function `wait(seconds) -> key or None`: single key presses without Enter when stdin is a
    terminal (cbreak mode, restored on exit); otherwise it only waits."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:

        def sleep_only(timeout_s: float) -> str | None:
            time.sleep(timeout_s)
            return None

        yield sleep_only
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)

        def wait(timeout_s: float) -> str | None:
            ready, _, _ = select.select([fd], [], [], timeout_s)
            return os.read(fd, 1).decode("utf-8", "replace") if ready else None

        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
