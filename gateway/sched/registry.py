"""The plugin registry: an explicit object mapping (kind, name) to a factory.

A registry is passed to whatever builds policies, never kept in a module global
(`gateway.sched.plugins.default_registry()` makes one holding the in-tree plugins). Registering a name
twice raises. Each factory declares a msgspec Struct of its parameters; unknown or ill-typed parameters
are errors that name the key path.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from gateway.core.errors import ConfigError
from gateway.core.slo import SloPolicy, default_slo_policy
from gateway.sched.interfaces import PreemptionRules
from gateway.sched.loads import LoadCaches


class PluginKind(enum.StrEnum):
    ORDERING = "ordering"
    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    ADMITTER = "admitter"
    EVICTOR = "evictor"
    PREEMPTOR = "preemptor"
    CONCURRENCY = "concurrency"
    SCALER = "scaler"


class NoParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


P = TypeVar("P", bound=msgspec.Struct)


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a factory may use besides its parameters."""

    seed: int | None = None
    # The policy's SLO classes (plugins read a class's band, kind and infeasibility outcome by name).
    slo: SloPolicy = field(default_factory=default_slo_policy)
    # Endpoint loads shared by the policy's plugins that predict with the same parameters.
    loads: LoadCaches = field(default_factory=LoadCaches, compare=False)
    # The policy's preemption rules (None: it never preempts), for the plugins built after its preemptor
    # (admission counts the seats preemption would free).
    preemption: PreemptionRules | None = None


@dataclass(frozen=True, slots=True)
class PluginSpec(Generic[P]):
    kind: PluginKind
    name: str
    params: type[P]
    factory: Callable[[P, BuildContext], Any]
    summary: str = ""


class PluginRegistry:
    def __init__(self) -> None:
        self._specs: dict[tuple[PluginKind, str], PluginSpec[Any]] = {}

    def register(self, spec: PluginSpec[Any]) -> None:
        key = (spec.kind, spec.name)
        if key in self._specs:
            raise ValueError(f"{spec.kind} plugin {spec.name!r} is already registered")
        self._specs[key] = spec

    def names(self, kind: PluginKind) -> list[str]:
        return sorted(n for (k, n) in self._specs if k == kind)

    def spec(self, kind: PluginKind, name: str) -> PluginSpec[Any] | None:
        return self._specs.get((kind, name))

    def build(
        self,
        kind: PluginKind,
        name: str,
        params: Mapping[str, Any] | None,
        *,
        path: str,
        ctx: BuildContext | None = None,
    ) -> Any:
        """Build plugin `name` of `kind`; errors name `path` (the key path of the plugin's table)."""
        spec = self._specs.get((kind, name))
        if spec is None:
            known = ", ".join(self.names(kind)) or "none"
            raise ConfigError(f"unknown {kind} plugin {name!r} (known: {known})", path=path)
        try:
            typed = msgspec.convert(dict(params or {}), spec.params, strict=True)
        except msgspec.ValidationError as e:
            raise ConfigError(_validation_message(e), path=_join_path(f"{path}.params", e)) from None
        try:
            return spec.factory(typed, ctx or BuildContext())
        except ValueError as e:
            raise ConfigError(str(e), path=f"{path}.params") from None


def _join_path(prefix: str, e: msgspec.ValidationError) -> str:
    # msgspec reports "... - at `$.foo[0]`"; turn `$` into our prefix.
    msg = str(e)
    marker = " - at `$"
    if marker in msg:
        rest = msg.split(marker, 1)[1].rstrip("`")
        return prefix + rest
    return prefix


def _validation_message(e: msgspec.ValidationError) -> str:
    return str(e).split(" - at `$", 1)[0]
