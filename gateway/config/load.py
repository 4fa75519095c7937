"""Loading gateway.toml: strict decode -> defaults -> cross-reference checks -> GatewayConfig.

Every error is a ConfigError whose str is `FILE:KEY.PATH: message`, e.g.
`conf/gateway.toml:endpoints[1].url: expected an http:// or https:// URL, got 'tcp://x'`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import msgspec.structs

from gateway.config.cluster import cluster_problems
from gateway.config.lifecycle import lifecycle_problems
from gateway.config.policy import load_default_policy, load_policy
from gateway.config.schema import (
    ENGINE_AUTO,
    EndpointConfig,
    EngineKey,
    GatewayConfig,
    GatewayFile,
    KeyEntry,
    KeysFile,
)
from gateway.config.secrets import read_secret
from gateway.config.validate import check_gateway, check_keys
from gateway.core.errors import ConfigError
from gateway.core.strict_toml import convert, convert_all, read_toml
from gateway.core.types import EndpointId, EngineKind
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy
from gateway.sched.registry import PluginRegistry

#: Overrides `server.admin_token` when set and non-empty (keeps the secret out of the file).
ADMIN_TOKEN_ENV: Final = "BERTH_ADMIN_TOKEN"

_ENGINE_CHOICES: Final[Mapping[type, tuple[str, ...]]] = {EngineKind: (ENGINE_AUTO,)}


def load_gateway_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """The checked configuration in the gateway.toml at `path`; raises the first ConfigError found.

    `env` (default: the process environment) supplies BERTH_ADMIN_TOKEN and the engines' api_key_env.
    """
    cfg, problems = gateway_config_problems(path, env=env)
    if problems:
        raise problems[0]
    assert cfg is not None  # no problems: the file decoded
    return cfg


def gateway_config_problems(
    path: str | Path, *, env: Mapping[str, str] | None = None
) -> tuple[GatewayConfig | None, list[ConfigError]]:
    """Like `load_gateway_config`, but every problem instead of the first: each bad value the strict
    decode finds (`convert_all`), then every cross-reference problem of the rest.

    A file that cannot be read or parsed still raises (nothing further can be said). With problems, the
    config (None when the decode could not set the bad values aside) holds defaults or stand-ins in
    their place: it is only good for checking what depends on it, such as the policy file it names.
    """
    p = Path(path)
    label = str(path)
    raw = _engine_auto_to_none(read_toml(p, label))
    decoded = convert_all(raw, GatewayFile, label=label, extra_choices=_ENGINE_CHOICES)
    f = decoded.value
    if f is None:
        return None, decoded.problems

    # defaults
    env = os.environ if env is None else env
    if env.get(ADMIN_TOKEN_ENV):
        f = msgspec.structs.replace(
            f, server=msgspec.structs.replace(f.server, admin_token=env[ADMIN_TOKEN_ENV])
        )
    policy_file = resolve_relative(f.policy.file, p.parent) if f.policy.file else None

    # cross-reference checks (of what decoded: a stand-in's problem is already reported)
    problems = [*decoded.problems]
    problems += [e.within(file=label) for e in check_gateway(f) if decoded.untouched(e)]
    if policy_file is not None and not policy_file.is_file():
        what = "is not a file" if policy_file.exists() else "not found"
        # A relative path that worked beside the repository's policies/ may point nowhere once the
        # file is copied elsewhere (/etc/berth): say where it was looked for.
        relative = not Path(f.policy.file).expanduser().is_absolute()
        hint = f" (relative to {_absolute(p.parent)}, the directory of this file)" if relative else ""
        problems.append(
            ConfigError(f"policy file {what}: {policy_file}{hint}", path="policy.file", file=label)
        )
    keys_file = resolve_relative(f.auth.keys_file, p.parent) if f.auth.keys_file else None
    keys: tuple[KeyEntry, ...] = ()
    if keys_file is not None:
        try:
            keys = load_keys_file(keys_file, f)
        except ConfigError as e:
            problems.append(e)
        except _KeysProblems as e:
            problems.extend(e.problems)
    engine_keys: dict[EndpointId, EngineKey] = {}
    for i, ep in enumerate(f.endpoints):
        try:
            key = read_engine_key(ep, p.parent, env)
        except ConfigError as e:
            problems.append(e.within(prefix=f"endpoints[{i}]", file=label))
            continue
        if key is not None:
            engine_keys[ep.endpoint_id] = key
    batch_dir = resolve_relative(f.batch.dir, p.parent) if f.batch.dir else None
    if batch_dir is not None and batch_dir.exists() and not batch_dir.is_dir():
        problems.append(ConfigError(f"not a directory: {batch_dir}", path="batch.dir", file=label))
    lifecycle, lifecycle_errors = lifecycle_problems(
        f.lifecycle, f.nodes, base=p.parent, label=label, registry=default_registry()
    )
    problems.extend(lifecycle_errors)
    cluster, cluster_errors = cluster_problems(f.cluster, base=p.parent, env=env)
    problems += [e.within(file=label) for e in cluster_errors]

    config = GatewayConfig(
        server=f.server,
        limits=f.limits,
        upstream=f.upstream,
        scrape=f.scrape,
        telemetry=f.telemetry,
        prefix=f.prefix,
        aliases=dict(f.aliases),
        endpoints=f.endpoints,
        tenants=f.tenants,
        auth=f.auth,
        ops=f.ops,
        batch=f.batch,
        batch_dir=batch_dir,
        keys=keys,
        keys_file=keys_file,
        engine_keys=engine_keys,
        file=_absolute(p),
        policy_file=policy_file,
        lifecycle=lifecycle,
        cluster=cluster,
    )
    return config, problems


class _KeysProblems(Exception):
    def __init__(self, problems: list[ConfigError]) -> None:
        super().__init__(str(problems[0]))
        self.problems = problems


def load_keys_file(path: Path, f: GatewayFile) -> tuple[KeyEntry, ...]:
    """The entries of the auth keys file at `path`, strictly decoded and checked against `f`'s tenants.
    Raises ConfigError (unreadable, syntax, decode) or _KeysProblems (every cross-reference problem)."""
    label = str(path)
    keys = convert(read_toml(path, label), KeysFile, label=label).keys
    problems = [e.within(file=label) for e in check_keys(keys, f.tenants)]
    if problems:
        raise _KeysProblems(problems)
    return tuple(KeyEntry(tenant=k.tenant, sha256=k.sha256.lower()) for k in keys)


def read_engine_key(ep: EndpointConfig, base: Path, env: Mapping[str, str]) -> EngineKey | None:
    """The endpoint's API key from its api_key_env or api_key_file (None: it has neither). A key file
    that group or others may read is refused: the key would not be the secret it is meant to be."""
    return read_secret(
        EngineKey,
        env_var=ep.api_key_env,
        file=ep.api_key_file,
        base=base,
        env=env,
        env_path="api_key_env",
        file_path="api_key_file",
        what="key",
    )


def default_config(*, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """The configuration without a file (`berth serve --endpoint ...`): defaults, packaged policy."""
    env = os.environ if env is None else env
    cfg = GatewayConfig()
    token = env.get(ADMIN_TOKEN_ENV)
    if token:
        cfg = msgspec.structs.replace(cfg, server=msgspec.structs.replace(cfg.server, admin_token=token))
    return cfg


def load_configured_policy(
    cfg: GatewayConfig, registry: PluginRegistry, *, seed: int | None = None
) -> Policy:
    """The policy `cfg` names: its policy file, or the packaged default when it names none."""
    if cfg.policy_file is None:
        return load_default_policy(registry, seed=seed)
    return load_policy(cfg.policy_file, registry, seed=seed)


def resolve_relative(path: str | Path, base: Path) -> Path:
    """`path` made absolute against directory `base` (`..` folded, symlinks kept as written)."""
    return _absolute(base / Path(path).expanduser())


def _absolute(p: Path) -> Path:
    return Path(os.path.normpath(p.absolute()))


def _engine_auto_to_none(raw: dict[str, Any]) -> dict[str, Any]:
    """`engine = "auto"` in an [[endpoints]] item means "not given" (None: detect it)."""
    endpoints = raw.get("endpoints")
    if not isinstance(endpoints, list):
        return raw
    items = [
        {k: v for k, v in e.items() if not (k == "engine" and v == ENGINE_AUTO)} if isinstance(e, dict) else e
        for e in endpoints
    ]
    return {**raw, "endpoints": items}
