"""The cluster-mode tests' redis-server (loadgen.redis_server): skipped, naming what to install, only when
redis-server is missing (`make test` installs Debian's redis-server package first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen import redis_server as _impl
from loadgen.redis_server import free_port

__all__ = ["RedisServer", "free_port"]


class RedisServer(_impl.RedisServer):
    def __init__(self, workdir: Path, *, password: str | None = None) -> None:
        try:
            super().__init__(workdir, password=password)
        except _impl.RedisMissing as e:
            pytest.skip(f"cluster tests need a real Redis: {e}")
