"""gateway.toml's `[lifecycle]` and `[[nodes]]`: the model registry the gateway starts engines from, the
node agents it runs, and how it evicts. Static: they take effect at start only.

```toml
[lifecycle]
models = "models.toml"        # the registry shared with the agents (relative to this file)
load_deadline_s = 300         # a request for a model that is not resident waits at most this for its load
churn_guard_s = 60            # never evict an instance loaded less than this ago
drain_timeout_s = 30          # in-flight requests of a victim finish up to this, then it is stopped
pinned = ["code-a"]           # never evicted
[lifecycle.evictor]
plugin = "cace"               # cace | lru
params = { demand_weight = 1.0 }
[[nodes]]
name = "gpu-07"
agent = ["ssh", "gpu-07", "berth-agent", "-c", "/etc/berth/agent.toml"]
models = ["code-a"]           # optional: the models it may host (default: any)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from gateway.agent.config import ModelSpec, models_file_problems
from gateway.core.errors import ConfigError
from gateway.sched.plugins.eviction.interface import Evictor
from gateway.sched.registry import PluginKind, PluginRegistry

PositiveInt = Annotated[int, Meta(ge=1)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]


class EvictorConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    plugin: str = "cace"
    params: dict[str, Any] = {}  # the evictor plugin's parameters


class LifecycleConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    models: str  # models.toml, relative to gateway.toml
    load_deadline_s: PositiveFloat = 300.0
    churn_guard_s: NonNegativeFloat = 60.0
    min_idle_s: NonNegativeFloat = 0.0  # never evict an instance idle for less than this
    drain_timeout_s: NonNegativeFloat = 30.0
    pinned: tuple[str, ...] = ()
    lookahead: PositiveInt = 32  # queued requests the evictor's demand term looks at
    expected_load_s: PositiveFloat = 30.0  # a model's load time until one is measured (models.toml may say)
    # Recent requests whose models' shares predict demand beyond the queue (the evictor's demand term).
    demand_history: PositiveInt = 256
    agent_timeout_s: PositiveFloat = 30.0  # per agent call other than start (start: the load deadline)
    refresh_interval_s: PositiveFloat = 10.0  # how often each agent's `list` is read (crashes, drift)
    evictor: EvictorConfig = EvictorConfig()


class NodeConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    name: str  # the node's name (endpoints and instances refer to it)
    agent: tuple[str, ...]  # the command prefix that runs berth-agent there
    models: tuple[str, ...] | None = None  # the models it may host; None: any


@dataclass(frozen=True, slots=True)
class LifecycleSetup:
    """The checked lifecycle configuration: the registry read, the evictor built."""

    config: LifecycleConfig
    nodes: tuple[NodeConfig, ...]
    models_file: Path
    models: Mapping[str, ModelSpec]
    evictor: Evictor


def lifecycle_problems(
    lifecycle: LifecycleConfig | None,
    nodes: tuple[NodeConfig, ...],
    *,
    base: Path,
    label: str,
    registry: PluginRegistry,
) -> tuple[LifecycleSetup | None, list[ConfigError]]:
    """Check `[lifecycle]` and `[[nodes]]` (and the models.toml it names) together."""
    if lifecycle is None:
        if nodes:
            return None, [
                ConfigError(
                    "[[nodes]] needs a [lifecycle] section (its models file)", path="nodes", file=label
                )
            ]
        return None, []
    problems: list[ConfigError] = []
    if not nodes:
        problems.append(
            ConfigError("needs at least one [[nodes]] item to start models on", path="lifecycle", file=label)
        )
    models_file = Path(base / Path(lifecycle.models).expanduser()).absolute()
    models: dict[str, ModelSpec] = {}
    if not models_file.is_file():
        what = "is not a file" if models_file.exists() else "not found"
        problems.append(
            ConfigError(f"models file {what}: {models_file}", path="lifecycle.models", file=label)
        )
    else:
        try:
            f, model_problems = models_file_problems(models_file)
        except ConfigError as e:
            problems.append(e)
        else:
            problems.extend(model_problems)
            models = {m.name: m for m in f.models}
    known = set(models)
    if models:
        for i, name in enumerate(lifecycle.pinned):
            if name not in known:
                problems.append(
                    ConfigError(
                        f"unknown model {name!r} (not in {models_file.name})",
                        path=f"lifecycle.pinned[{i}]",
                        file=label,
                    )
                )
    seen: dict[str, int] = {}
    for i, n in enumerate(nodes):
        where = f"nodes[{i}]"
        if not n.name.strip():
            problems.append(ConfigError("must not be empty", path=f"{where}.name", file=label))
        elif n.name in seen:
            problems.append(
                ConfigError(
                    f"duplicate node name {n.name!r} (already used by nodes[{seen[n.name]}])",
                    path=f"{where}.name",
                    file=label,
                )
            )
        else:
            seen[n.name] = i
        if not n.agent or not all(a.strip() for a in n.agent):
            problems.append(
                ConfigError(
                    "must be a non-empty list of non-empty strings", path=f"{where}.agent", file=label
                )
            )
        if models and n.models is not None:
            for j, name in enumerate(n.models):
                if name not in known:
                    problems.append(
                        ConfigError(
                            f"unknown model {name!r} (not in {models_file.name})",
                            path=f"{where}.models[{j}]",
                            file=label,
                        )
                    )
    evictor: Evictor | None = None
    ev = lifecycle.evictor
    try:
        built = registry.build(PluginKind.EVICTOR, ev.plugin, ev.params, path="lifecycle.evictor")
    except ConfigError as e:
        problems.append(e.within(file=label))
    else:
        if isinstance(built, Evictor):
            evictor = built
        else:
            problems.append(
                ConfigError(
                    f"evictor plugin {ev.plugin!r} does not implement Evictor",
                    path="lifecycle.evictor.plugin",
                    file=label,
                )
            )
    if problems or evictor is None:
        return None, problems
    return LifecycleSetup(
        config=lifecycle, nodes=nodes, models_file=models_file, models=models, evictor=evictor
    ), []
