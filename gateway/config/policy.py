"""Policy files (policies/*.toml): strict schema, then plugins built through the registry.

```toml
name = "default"                  # default: the file's stem
description = "..."
[ordering]
plugin = "fcfs"
params = {}
[placement]
picker = { plugin = "max-score", params = {} }
filters = []                      # [{plugin, params}, ...]
[[placement.scorers]]
plugin = "least-outstanding"
weight = 1.0                      # >= 0; weights live here, not in the plugin
params = {}
```
Every error names the file and the key path (`placement.scorers[0].params.foo`).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Annotated, Any, Final

import msgspec
import msgspec.structs
from msgspec import Meta

from gateway.config.decode import convert, join_path, parse_toml, read_toml, validation_error
from gateway.core.errors import ConfigError
from gateway.sched.profile import Policy, SchedulerProfile, WeightedScorer
from gateway.sched.registry import BuildContext, PluginKind, PluginRegistry

#: The packaged policy used when no policy file is configured (an installed wheel carries it).
DEFAULT_POLICY_RESOURCE: Final = "default_policy.toml"
DEFAULT_POLICY_LABEL: Final = "<packaged>/gateway/config/default_policy.toml"

#: Top-level keys that mark a TOML file as a policy file rather than a gateway.toml.
POLICY_MARKERS: Final = frozenset({"ordering", "placement"})


class PluginRef(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    plugin: str
    params: dict[str, Any] = {}


class ScorerRef(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    plugin: str
    weight: Annotated[float, Meta(ge=0)] = 1.0
    params: dict[str, Any] = {}


class PlacementSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    picker: PluginRef
    filters: tuple[PluginRef, ...] = ()
    scorers: tuple[ScorerRef, ...] = ()


class PolicyFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A policy file exactly as written."""

    name: str = ""  # empty: the file's stem
    description: str = ""
    ordering: PluginRef
    placement: PlacementSection


def load_policy(path: str | Path, registry: PluginRegistry, *, seed: int | None = None) -> Policy:
    """Read, check and build the policy file at `path`."""
    p = Path(path)
    label = str(path)
    return build_policy(decode_policy(read_toml(p, label), label), label, registry, seed=seed, stem=p.stem)


def load_default_policy(registry: PluginRegistry, *, seed: int | None = None) -> Policy:
    """The packaged default policy (gateway/config/default_policy.toml)."""
    return parse_policy_text(default_policy_text(), DEFAULT_POLICY_LABEL, registry, seed=seed)


def default_policy_text() -> str:
    return importlib.resources.files("gateway.config").joinpath(DEFAULT_POLICY_RESOURCE).read_text("utf-8")


def parse_policy_text(
    text: str | bytes, file: str, registry: PluginRegistry, *, seed: int | None = None
) -> Policy:
    """Check and build a policy from TOML text; errors are reported against `file`."""
    return build_policy(
        decode_policy(parse_toml(text, file), file), file, registry, seed=seed, stem=Path(file).stem
    )


def decode_policy(raw: dict[str, Any], file: str) -> PolicyFile:
    """The strict decode stage alone (no plugins built)."""
    return convert(raw, PolicyFile, label=file)


def build_policy(
    pf: PolicyFile, file: str, registry: PluginRegistry, *, seed: int | None = None, stem: str = ""
) -> Policy:
    """Build every plugin `pf` names; errors name `file` and the plugin's key path."""
    name = pf.name or stem
    if not name.strip():
        raise ConfigError("policy name must not be empty", path="name", file=file)
    ctx = BuildContext(seed=seed)
    try:
        ordering = _build(registry, PluginKind.ORDERING, pf.ordering, "ordering", ctx)
        placement = pf.placement
        filters = tuple(
            _build(registry, PluginKind.FILTER, ref, f"placement.filters[{i}]", ctx)
            for i, ref in enumerate(placement.filters)
        )
        scorers = tuple(
            WeightedScorer(
                _build(registry, PluginKind.SCORER, ref, f"placement.scorers[{i}]", ctx), ref.weight
            )
            for i, ref in enumerate(placement.scorers)
        )
        picker = _build(registry, PluginKind.PICKER, placement.picker, "placement.picker", ctx)
    except ConfigError as e:
        raise e.within(file=file) from None
    return Policy(
        name=name,
        ordering=ordering,
        profile=SchedulerProfile(filters=filters, scorers=scorers, picker=picker),
        source=file,
    )


def is_policy_table(raw: dict[str, Any]) -> bool:
    """A parsed TOML file is a policy file (rather than a gateway.toml)."""
    return not POLICY_MARKERS.isdisjoint(raw)


def _build(
    registry: PluginRegistry, kind: PluginKind, ref: PluginRef | ScorerRef, path: str, ctx: BuildContext
) -> Any:
    spec = registry.spec(kind, ref.plugin)
    if spec is None:
        raise ConfigError(_unknown_plugin(registry, kind, ref.plugin), path=f"{path}.plugin")
    if ref.params and not msgspec.structs.fields(spec.params):
        key = join_path(f"{path}.params", [next(iter(ref.params))])
        raise ConfigError(f"{kind} plugin {ref.plugin!r} takes no parameters", path=key)
    # Check the parameters here first so their errors get the same key paths and wording as the
    # rest of the file (unknown keys listed, `[...]` resolved); the registry converts them again.
    try:
        msgspec.convert(ref.params, spec.params, strict=True)
    except msgspec.ValidationError as e:
        raise validation_error(e, spec.params, ref.params, prefix=f"{path}.params") from None
    return registry.build(kind, ref.plugin, ref.params, path=path, ctx=ctx)


def _unknown_plugin(registry: PluginRegistry, kind: PluginKind, name: str) -> str:
    known = ", ".join(registry.names(kind)) or "none"
    message = f"unknown {kind} plugin {name!r} (known: {known})"
    other = [k for k in PluginKind if k is not kind and registry.spec(k, name) is not None]
    if other:
        message += f"; {name!r} is a {' and '.join(other)} plugin"
    return message
