"""Command-line overrides: `--endpoint URL[,key=value...]`, `--listen`, `--policy`, `--batch-dir`.

Flags override the file: any --endpoint flags replace the file's whole endpoint list, also on every
reload (`load_runtime` takes the same overrides as `apply_overrides`). Errors are ConfigErrors whose
path is the flag (`--endpoint: ...`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
import msgspec.structs

from gateway.config.schema import ENGINE_AUTO, EndpointConfig, GatewayConfig
from gateway.config.validate import check_endpoint, check_listen, duplicate_endpoints
from gateway.core.errors import ConfigError
from gateway.core.strict_toml import validation_error
from gateway.core.types import EngineKind

ENDPOINT_FLAG: Final = "--endpoint"
LISTEN_FLAG: Final = "--listen"
POLICY_FLAG: Final = "--policy"
BATCH_DIR_FLAG: Final = "--batch-dir"

#: Options after the URL, in the order the help text lists them.
ENDPOINT_OPTIONS: Final = (
    "engine",
    "class",
    "models",
    "cap",
    "id",
    "node",
    "scheduling",
    "max_batch",
    "config",
    "kv_events",
    "kv_events_replay",
    "kv_events_topic",
)


def parse_endpoint_flag(value: str) -> EndpointConfig:
    """One `--endpoint URL[,engine=vllm|sglang|auto][,class=interactive|mixed|batch][,models=a|b]
    [,cap=N][,id=NAME][,node=NAME][,scheduling=fcfs|priority][,max_batch=N][,config=NAME]
    [,kv_events=tcp://HOST:PORT][,kv_events_replay=tcp://HOST:PORT][,kv_events_topic=T]` flag as an
    EndpointConfig."""

    def fail(message: str) -> ConfigError:
        return ConfigError(f"{value!r}: {message}", path=ENDPOINT_FLAG)

    url, *options = (part.strip() for part in value.split(","))
    if not url:
        raise fail("expected URL[,key=value...]")
    raw: dict[str, Any] = {"url": url}
    for option in options:
        key, sep, val = option.partition("=")
        key = key.strip()
        val = val.strip()
        if not sep:
            raise fail(f"expected key=value after the URL, got {option!r}")
        if key not in ENDPOINT_OPTIONS:
            raise fail(f"unknown option {key!r} (known: {', '.join(ENDPOINT_OPTIONS)})")
        if key in raw:
            raise fail(f"option {key!r} given twice")
        if key == "models":
            raw[key] = [m.strip() for m in val.split("|")]
        elif key in ("cap", "max_batch"):
            try:
                raw[key] = int(val)
            except ValueError:
                raise fail(f"{key}: expected an integer, got {val!r}") from None
        elif key == "engine" and val == ENGINE_AUTO:
            continue
        else:
            raw[key] = val
    try:
        ep = msgspec.convert(raw, EndpointConfig, strict=True)
    except msgspec.ValidationError as e:
        err = validation_error(e, EndpointConfig, raw, extra_choices={EngineKind: (ENGINE_AUTO,)})
        raise fail(f"{err.path}: {err.message}") from None
    problems = check_endpoint(ep)
    if problems:
        raise fail(f"{problems[0].path}: {problems[0].message}")
    return ep


def apply_overrides(
    cfg: GatewayConfig,
    *,
    listen: str | None = None,
    endpoints: Sequence[EndpointConfig] = (),
    policy_file: str | Path | None = None,
    batch_dir: str | Path | None = None,
) -> GatewayConfig:
    """`cfg` with command-line values in place of the file's; given --endpoint flags replace the list.

    A relative `policy_file` resolves against the current directory (where the command was typed).
    """
    changes: dict[str, Any] = {}
    if listen is not None:
        problem = check_listen(listen)
        if problem:
            raise ConfigError(problem, path=LISTEN_FLAG)
        changes["server"] = msgspec.structs.replace(cfg.server, listen=listen)
    if endpoints:
        dups = duplicate_endpoints(endpoints)
        if dups:
            d = dups[0]
            raise ConfigError(
                f"{d.describe()} (--endpoint #{d.index + 1} repeats #{d.first + 1})", path=ENDPOINT_FLAG
            )
        changes["endpoints"] = tuple(endpoints)
    if policy_file is not None:
        p = Path(os.path.normpath(Path(policy_file).expanduser().absolute()))
        if not p.is_file():
            raise ConfigError(f"policy file not found: {p}", path=POLICY_FLAG)
        changes["policy_file"] = p
    if batch_dir is not None:
        b = Path(os.path.normpath(Path(batch_dir).expanduser().absolute()))
        if b.exists() and not b.is_dir():
            raise ConfigError(f"not a directory: {b}", path=BATCH_DIR_FLAG)
        changes["batch_dir"] = b
    return msgspec.structs.replace(cfg, **changes) if changes else cfg
