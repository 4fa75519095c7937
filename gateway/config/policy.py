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
# optional:
[admission]                       # absent: admit everything (class queue bounds still hold)
plugin = "slo-feasibility"
[preemption]                      # absent: never preempt (plugins: least-progress, most-slack,
plugin = "least-progress"         # smallest-kv-loss; params by, victims, classes, max_preemptions, ...)
[concurrency]                     # absent: the configured caps (static); chiron: adaptive caps
plugin = "chiron"
[slo]                             # absent: one class "default" without targets
default_class = "chat"
[[slo.classes]]                   # name, kind, band, ttft_ms, itl_ms, e2e_ms, task_sla_ms, task_metric,
name = "chat"                     # steps, on_infeasible (reject | hold | best-effort), max_queue
[[slo.rules]]                     # class + model / path / stream / max_tokens_min|max /
class = "chat"                    # prompt_chars_min|max / body = {field = value}
[tasks]                           # idle_expiry_s, max_tasks, learn_allotments, learn_min_samples
[autoscale]                       # absent: no autoscaling; plugins chiron, cato-sla, aladdin-workers,
plugin = "chiron"                 # utilization-band, queue-length
params = {}
dry_run = false                   # decide and record, act on nothing (turn it on first)
interval_s = 5                    # between two autoscale rounds
scale_out_cooldown_s = 0          # after a model's scale-out, before its next one
scale_in_cooldown_s = 60          # after a model's scale-out or scale-in, before its next scale-in
reclass_cooldown_s = 30           # after an instance's re-class, before its next one
min_instances = 0                 # every model's bounds, unless its own table says otherwise
max_instances = 8                 # absent: bounded by the devices only
[autoscale.models.code-a]         # per model (the served name): min_instances, max_instances
min_instances = 1
```
`placement.lookahead` lets that many requests behind one that fits nowhere be placed before it.
Where each kind of plugin sits in the file, whether it is one or a list, required or optional, and the
Protocol it must satisfy is one table, `SLOTS`; the build walks it. Every error names the file and the
key path (`placement.scorers[0].params.foo`).
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import msgspec
import msgspec.structs

from gateway.config.policy_schema import (
    AutoscaleSection,
    PluginRef,
    PolicyFile,
    ScorerRef,
)
from gateway.config.policy_slo import slo_problems
from gateway.core.errors import ConfigError
from gateway.core.strict_toml import (
    Decoded,
    convert,
    convert_all,
    join_path,
    parse_toml,
    read_toml,
    validation_error,
)
from gateway.core.types import ModelName
from gateway.sched.autoscale import UNBOUNDED, Autoscale, AutoscaleSettings, ModelBounds
from gateway.sched.interfaces import (
    Admitter,
    ConcurrencyController,
    Filter,
    Ordering,
    Picker,
    Preemptor,
    Scorer,
)
from gateway.sched.plugins.autoscale.interface import Scaler
from gateway.sched.profile import Policy, SchedulerProfile, WeightedScorer
from gateway.sched.registry import BuildContext, PluginKind, PluginRegistry

#: The packaged policy used when no policy file is configured (an installed wheel carries it).
DEFAULT_POLICY_RESOURCE: Final = "default_policy.toml"
DEFAULT_POLICY_LABEL: Final = "<packaged>/gateway/config/default_policy.toml"

#: Top-level keys that mark a TOML file as a policy file rather than a gateway.toml.
POLICY_MARKERS: Final = frozenset({"ordering", "placement"})


@dataclass(frozen=True, slots=True)
class Slot:
    """Where the plugins of one kind sit in a policy file, and what each must be."""

    kind: PluginKind
    key: str  # key path of its {plugin, params} table or, with `many`, of its array of them
    many: bool  # an array of plugins (absent: none) rather than one
    required: bool  # the file must name it (else absent means none)
    protocol: type  # the runtime-checkable Protocol (gateway.sched.interfaces) every plugin here satisfies


#: Every kind of plugin a policy file names, in the order they are built (and their problems reported).
#: The schema above (PolicyFile, PlacementSection) has a field at each key, of the same shape.
SLOTS: Final[tuple[Slot, ...]] = (
    Slot(PluginKind.ORDERING, "ordering", many=False, required=True, protocol=Ordering),
    Slot(PluginKind.FILTER, "placement.filters", many=True, required=False, protocol=Filter),
    Slot(PluginKind.SCORER, "placement.scorers", many=True, required=False, protocol=Scorer),
    Slot(PluginKind.PICKER, "placement.picker", many=False, required=True, protocol=Picker),
    # (the preemptor before the admitter: admission counts the seats its rules free, BuildContext.preemption)
    Slot(PluginKind.PREEMPTOR, "preemption", many=False, required=False, protocol=Preemptor),
    Slot(PluginKind.ADMITTER, "admission", many=False, required=False, protocol=Admitter),
    Slot(PluginKind.CONCURRENCY, "concurrency", many=False, required=False, protocol=ConcurrencyController),
    Slot(PluginKind.SCALER, "autoscale", many=False, required=False, protocol=Scaler),
)

#: What a policy file's plugins built to, by kind: (the file's reference, the plugin) in file order.
Built = dict[PluginKind, list[tuple[PluginRef | ScorerRef | AutoscaleSection, Any]]]


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


def decode_policy_all(raw: dict[str, Any], file: str) -> Decoded[PolicyFile]:
    """The strict decode stage, every problem (see `convert_all`)."""
    return convert_all(raw, PolicyFile, label=file)


def build_policy(
    pf: PolicyFile, file: str, registry: PluginRegistry, *, seed: int | None = None, stem: str = ""
) -> Policy:
    """Build every plugin `pf` names; raises the first problem (named by `file` and key path)."""
    policy, problems = policy_problems(pf, file, registry, seed=seed, stem=stem)
    if problems:
        raise problems[0]
    assert policy is not None  # no problems: built
    return policy


def policy_problems(
    pf: PolicyFile, file: str, registry: PluginRegistry, *, seed: int | None = None, stem: str = ""
) -> tuple[Policy | None, list[ConfigError]]:
    """The policy `pf` builds to, or None and every problem found (each named by `file` and key path):
    the name, the `[slo]` section, and each plugin on its own."""
    problems: list[ConfigError] = []
    name = pf.name or stem
    if not name.strip():
        problems.append(ConfigError("policy name must not be empty", path="name"))
    slo, slo_errors = slo_problems(pf)
    problems += slo_errors
    ctx = BuildContext(seed=seed, slo=slo)
    built, plugin_errors = plugin_problems(pf, registry, ctx)
    problems += plugin_errors
    settings, autoscale_errors = autoscale_settings(pf.autoscale)
    problems += autoscale_errors
    if problems:
        return None, [e.within(file=file) for e in problems]
    scorers = tuple(WeightedScorer(p, _weight(ref)) for ref, p in built[PluginKind.SCORER])
    policy = Policy(
        name=name,
        ordering=_one(built, PluginKind.ORDERING),
        profile=SchedulerProfile(
            filters=tuple(p for _, p in built[PluginKind.FILTER]),
            scorers=scorers,
            picker=_one(built, PluginKind.PICKER),
        ),
        source=file,
        slo=slo,
        admitter=_one(built, PluginKind.ADMITTER),
        lookahead=pf.placement.lookahead,
        preemptor=_one(built, PluginKind.PREEMPTOR),
        concurrency=_one(built, PluginKind.CONCURRENCY),
        autoscale=None if settings is None else Autoscale(_one(built, PluginKind.SCALER), settings),
        loads=ctx.loads,
    )
    return policy, []


def autoscale_settings(sec: AutoscaleSection | None) -> tuple[AutoscaleSettings | None, list[ConfigError]]:
    """The runner's settings from `[autoscale]` (None when absent), and the bounds' problems."""
    if sec is None:
        return None, []
    problems: list[ConfigError] = []
    default = ModelBounds(sec.min_instances, UNBOUNDED if sec.max_instances is None else sec.max_instances)
    if default.min_instances > default.max_instances:
        problems.append(
            ConfigError(
                f"must not be below min_instances ({default.min_instances})", path="autoscale.max_instances"
            )
        )
    bounds: dict[ModelName, ModelBounds] = {}
    for name, m in sec.models.items():
        where = join_path("autoscale.models", [name])
        if not name.strip():
            problems.append(ConfigError("a model name must not be empty", path=where))
            continue
        b = ModelBounds(
            default.min_instances if m.min_instances is None else m.min_instances,
            default.max_instances if m.max_instances is None else m.max_instances,
        )
        if b.min_instances > b.max_instances:
            problems.append(
                ConfigError(
                    f"must not be below min_instances ({b.min_instances})", path=f"{where}.max_instances"
                )
            )
        bounds[ModelName(name)] = b
    settings = AutoscaleSettings(
        interval_s=sec.interval_s,
        scale_out_cooldown_s=sec.scale_out_cooldown_s,
        scale_in_cooldown_s=sec.scale_in_cooldown_s,
        reclass_cooldown_s=sec.reclass_cooldown_s,
        dry_run=sec.dry_run,
        default_bounds=default,
        bounds=bounds,
    )
    return settings, problems


def build_plugins(pf: PolicyFile, registry: PluginRegistry, ctx: BuildContext) -> Built:
    """Build every plugin `pf` names, slot by slot (`SLOTS`); raises the first problem."""
    built, problems = plugin_problems(pf, registry, ctx)
    if problems:
        raise problems[0]
    return built


def plugin_problems(
    pf: PolicyFile, registry: PluginRegistry, ctx: BuildContext
) -> tuple[Built, list[ConfigError]]:
    """Every plugin `pf` names built, slot by slot (`SLOTS`), and the problem of each one that did not
    build (named by the plugin's key path); only the plugins that built are in the result."""
    built: Built = {}
    problems: list[ConfigError] = []
    for slot in SLOTS:
        found: Any = pf
        for part in slot.key.split("."):
            found = getattr(found, part)
        if slot.many:
            refs = [(f"{slot.key}[{i}]", ref) for i, ref in enumerate(found)]
        elif found is not None:
            refs = [(slot.key, found)]
        elif slot.required:  # the strict decode has already refused this
            problems.append(ConfigError("missing required key", path=slot.key))
            refs = []
        else:
            refs = []
        built[slot.kind] = []
        for path, ref in refs:
            try:
                plugin = _build(registry, slot, ref, path, ctx)
            except ConfigError as e:
                problems.append(e)
                continue
            built[slot.kind].append((ref, plugin))
            if slot.kind is PluginKind.PREEMPTOR:
                ctx = replace(ctx, preemption=plugin.rules)
    return built, problems


def _one(built: Built, kind: PluginKind) -> Any:
    """The plugin of a single slot; None when the file names none."""
    items = built[kind]
    return items[0][1] if items else None


def _weight(ref: PluginRef | ScorerRef | AutoscaleSection) -> float:
    # Every [[placement.scorers]] item decodes to a ScorerRef; no other slot holds scorers.
    if not isinstance(ref, ScorerRef):
        raise TypeError(f"a scorer without a weight: {ref!r}")
    return ref.weight


def is_policy_table(raw: dict[str, Any]) -> bool:
    """A parsed TOML file is a policy file (rather than a gateway.toml)."""
    return not POLICY_MARKERS.isdisjoint(raw)


def _build(
    registry: PluginRegistry,
    slot: Slot,
    ref: PluginRef | ScorerRef | AutoscaleSection,
    path: str,
    ctx: BuildContext,
) -> Any:
    kind = slot.kind
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
    plugin = registry.build(kind, ref.plugin, ref.params, path=path, ctx=ctx)
    if not isinstance(plugin, slot.protocol):
        raise ConfigError(
            f"{kind} plugin {ref.plugin!r} does not implement {slot.protocol.__name__}", path=f"{path}.plugin"
        )
    return plugin


def _unknown_plugin(registry: PluginRegistry, kind: PluginKind, name: str) -> str:
    known = ", ".join(registry.names(kind)) or "none"
    message = f"unknown {kind} plugin {name!r} (known: {known})"
    other = [k for k in PluginKind if k is not kind and registry.spec(k, name) is not None]
    if other:
        message += f"; {name!r} is a {' and '.join(other)} plugin"
    return message
