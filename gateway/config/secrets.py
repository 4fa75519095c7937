"""Secrets the gateway reads at load time (an engine's API key, the Redis password): one way to read
them, from an environment variable or from a file only its owner may read, and one value type whose
repr and str never show them."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from gateway.core.errors import ConfigError


class Secret:
    """A secret value; its repr and str hide it (logs, tracebacks and `berth check` never show it)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and type(other) is type(self) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<hidden>)"

    __str__ = __repr__


S = TypeVar("S", bound=Secret)


def read_secret(
    kind: type[S],
    *,
    env_var: str | None,
    file: str | None,
    base: Path,
    env: Mapping[str, str],
    env_path: str,
    file_path: str,
    what: str,
) -> S | None:
    """The secret from the environment variable `env_var`, else from `file` (relative to `base`); None
    when neither is given. A file that is not a regular file, or that group or others may read, is
    refused: the value would not be the secret it is meant to be. Errors name `env_path`/`file_path`."""
    if env_var is not None:
        value = env.get(env_var, "").strip()
        if not value:
            raise ConfigError(f"environment variable {env_var} is not set or empty", path=env_path)
        return kind(value)
    if file is None:
        return None
    path = Path(os.path.normpath((base / Path(file).expanduser()).absolute()))  # `..` folded
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"not a regular file: {path}", path=file_path)
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{path} may be read by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"run: chmod 600 {path}",
                path=file_path,
            )
        value = path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}", path=file_path) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text", path=file_path) from None
    if not value or any(c.isspace() for c in value):
        raise ConfigError(f"{path} must hold one {what} on one line", path=file_path)
    return kind(value)
