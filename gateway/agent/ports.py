"""Ports for engines: the first in `port_range` that no instance record holds and that binds now."""

from __future__ import annotations

import socket
from collections.abc import Collection


def free_port(port_range: tuple[int, int], host: str, taken: Collection[int]) -> int | None:
    lo, hi = port_range
    for port in range(lo, hi + 1):
        if port not in taken and _binds(host, port):
            return port
    return None


def _binds(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like the engine will: TIME_WAIT is fine
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
