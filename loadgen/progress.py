"""A one-line progress bar for terminals (the CLI shows it only when stdout is a TTY)."""

from __future__ import annotations

from typing import TextIO

from loadgen.runner import LiveSnapshot


class ProgressBar:
    def __init__(self, stream: TextIO, width: int = 30) -> None:
        self._stream = stream
        self._width = width

    def update(self, snap: LiveSnapshot) -> None:
        frac = min(1.0, snap.elapsed_s / snap.duration_s) if snap.duration_s > 0 else 1.0
        filled = int(frac * self._width)
        bar = "#" * filled + "-" * (self._width - filled)
        goodput = "-" if snap.goodput is None else f"{snap.goodput * 100:.0f}%"
        self._stream.write(
            f"\r[{bar}] {snap.elapsed_s:6.1f}s tasks {snap.tasks_started}/{snap.tasks_scheduled} "
            f"done {snap.requests_done} in-flight {snap.in_flight} err {snap.errors} goodput {goodput}  "
        )
        self._stream.flush()

    def close(self) -> None:
        self._stream.write("\n")
        self._stream.flush()
