"""The reload transaction: build the whole new runtime configuration aside, or fail without effect.

`load_runtime` re-reads gateway.toml (reloadable sections, endpoint list) and the policy file, applies
the command-line overrides the process started with, builds every plugin, and returns a RuntimeConfig.
The caller swaps its references only when this returns; on ConfigError the old configuration stays
(and the caller counts the rejection). Static settings that changed in the file are not applied; they
are listed in `static_changes` so the caller can warn that a restart is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec
import msgspec.structs

from gateway.config.cli_overrides import apply_overrides
from gateway.config.load import load_configured_policy, load_gateway_config
from gateway.config.schema import EndpointConfig, GatewayConfig, ScrapeConfig
from gateway.config.validate import check_batch_class, check_tenant_classes
from gateway.core.types import EndpointId, EngineKind
from gateway.sched.profile import Policy
from gateway.sched.registry import PluginRegistry
from gateway.sched.types import EndpointSpec, QueueLimits

#: Sections read only at start; a change needs a restart.
STATIC_SECTIONS: Final = ("server", "upstream", "ops", "batch")


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Everything a reload swaps in, built and checked."""

    config: GatewayConfig  # effective: the new reloadable sections, the running static ones
    policy: Policy
    endpoints: tuple[EndpointSpec, ...]
    engine_auto: Mapping[EndpointId, bool]  # True: detect the engine kind from /metrics
    limits: QueueLimits
    aliases: Mapping[str, str]
    scrape: ScrapeConfig
    static_changes: tuple[str, ...] = ()  # "server.listen changed; restart needed"


def load_runtime(
    cfg_path: str | Path | None,
    base: GatewayConfig,
    registry: PluginRegistry,
    *,
    listen: str | None = None,
    endpoints: Sequence[EndpointConfig] = (),
    policy_file: str | Path | None = None,
    seed: int | None = None,
    detected: Mapping[EndpointId, EngineKind] | None = None,
    env: Mapping[str, str] | None = None,
) -> RuntimeConfig:
    """Build the runtime configuration from `cfg_path` and the command-line overrides.

    `cfg_path` None (started with flags only): `base`'s sections stay, the policy file is re-read.
    `base` is the configuration the process started with; its static sections stay in effect and any
    difference is reported in `static_changes`. `listen`, `endpoints` and `policy_file` are the flags
    the process started with (see `apply_overrides`). Raises ConfigError naming the file and key path
    on any problem; nothing is changed then.
    """
    loaded = base if cfg_path is None else load_gateway_config(cfg_path, env=env)
    new = apply_overrides(loaded, listen=listen, endpoints=endpoints, policy_file=policy_file)
    changes = tuple(static_changes(base, new))
    cfg = msgspec.structs.replace(
        new,
        server=base.server,
        upstream=base.upstream,
        ops=base.ops,
        batch=base.batch,
        batch_dir=base.batch_dir,
    )
    policy = load_configured_policy(cfg, registry, seed=seed)
    for problem in [
        *check_tenant_classes(cfg.tenants, policy.slo),
        *check_batch_class(cfg.batch, policy.slo),
    ]:
        raise problem.within(file=str(cfg.file or ""))
    return RuntimeConfig(
        config=cfg,
        policy=policy,
        endpoints=tuple(cfg.endpoint_specs(detected)),
        engine_auto={e.endpoint_id: e.engine_auto for e in cfg.endpoints},
        limits=cfg.queue_limits(),
        aliases=dict(cfg.aliases),
        scrape=cfg.scrape,
        static_changes=changes,
    )


def static_changes(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """One line per static setting that differs: "server.listen changed; restart needed"."""
    out: list[str] = []
    for section in STATIC_SECTIONS:
        before = getattr(old, section)
        after = getattr(new, section)
        for field in msgspec.structs.fields(before):
            if getattr(before, field.name) != getattr(after, field.name):
                out.append(f"{section}.{field.encode_name} changed; restart needed")
    before_lc, after_lc = old.lifecycle, new.lifecycle
    if (before_lc is None) != (after_lc is None) or (
        before_lc is not None
        and after_lc is not None
        and (before_lc.config != after_lc.config or before_lc.nodes != after_lc.nodes)
    ):
        out.append("lifecycle or nodes changed; restart needed")
    return out
