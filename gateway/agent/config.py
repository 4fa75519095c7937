"""agent.toml and models.toml: strict decode -> defaults -> cross-reference checks -> AgentConfig.

Every error is a ConfigError whose str is `FILE:KEY.PATH: message`, e.g.
`conf/models.toml:models[1].command[4]: unknown placeholder {gpu} (known: devices, host, ...)`.
models.toml is the registry shared by the gateway and the agents; agent.toml names it relative to itself.
"""

from __future__ import annotations

import os
import re
import socket
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
import msgspec.structs
from msgspec import Meta

from gateway.core.errors import ConfigError
from gateway.core.strict_toml import convert, read_toml
from gateway.core.types import EngineKind

PositiveInt = Annotated[int, Meta(ge=1)]
Port = Annotated[int, Meta(ge=1, le=65535)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]

GIB: Final = 1 << 30

#: The placeholders a command template (and `env` values) may use; see `render`. `max_batch` is the
#: instance configuration's (`[[models.configs]]`): vLLM's `--max-num-seqs`, SGLang's
#: `--max-running-requests`.
PLACEHOLDERS: Final = ("devices", "host", "id", "max_batch", "model", "port", "tp")
#: What an instance configuration's name may be (it appears in instance records and `list`).
CONFIG_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

Backend = Literal["process", "systemd"]

#: Unit properties the systemd backend sets itself (see gateway.agent.backends.systemd).
_FIXED_PROPERTIES: Final = frozenset({"Type", "KillMode", "StandardOutput", "StandardError"})


class DeviceConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[[devices]]: a device whose size is configured (overrides NVML's device of the same name)."""

    name: str  # NVML's devices are named gpu0, gpu1, ... by index
    memory_gib: PositiveFloat
    index: Annotated[int, Meta(ge=0)] | None = (
        None  # CUDA index; default: the N of a name gpuN, else position
    )


class AgentFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """agent.toml."""

    models: str = "models.toml"  # relative to agent.toml
    state_dir: str = "/var/lib/berth-agent"  # relative to agent.toml when not absolute
    backend: Backend = "process"
    port_range: tuple[Port, Port] = (20000, 20999)
    headroom_gib: NonNegativeFloat = 1.0  # per device, never handed out
    host: str = "127.0.0.1"  # engines listen here ({host})
    advertise_host: str = ""  # the host in reported URLs; default `host` (the hostname when it is a wildcard)
    nvml: bool = True  # read devices and measured memory through NVML when it is present
    release_wait_s: NonNegativeFloat = (
        10.0  # after a stop: NVML's bound to see memory free, else a fixed wait
    )
    stop_timeout_s: NonNegativeFloat = 30.0  # SIGTERM -> SIGKILL when `stop` gives no --drain-timeout
    systemd_properties: tuple[
        str, ...
    ] = ()  # extra `--property=` of each engine unit, e.g. "LimitMEMLOCK=infinity"
    devices: tuple[DeviceConfig, ...] = ()


class InstanceConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One [[models.configs]] entry: a way to run the model (MaaSO's heterogeneous instances). Small
    batches decode each request faster (tight deadlines), large ones give throughput."""

    name: str  # e.g. "tp1-b8"; `berth-agent start MODEL --config NAME`
    max_batch: PositiveInt  # {max_batch}: the engine's --max-num-seqs / --max-running-requests
    devices: PositiveInt | None = None  # tensor parallel ({tp}); default: the model's `devices`
    memory_gib: PositiveFloat | None = None  # per device; default: the model's `memory_gib`


class ModelSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One [[models]] entry of models.toml.

    With `configs`, every instance runs one of them (the `default_config`, else the first, unless a
    start names another): its `devices`, `memory_gib` and `max_batch` replace the model's. Without,
    an instance is the model as written and `{max_batch}` is not available.
    """

    name: str  # the name clients use ({model})
    engine: EngineKind
    command: tuple[str, ...]  # argv template; placeholders: PLACEHOLDERS
    memory_gib: PositiveFloat  # per device
    devices: PositiveInt = 1  # tensor parallel
    health_path: str = "/health"
    load_timeout_s: PositiveFloat = 300.0  # a start fails when /health has not answered by then
    # The gateway's expected load time (its eviction score's reload cost) until one is measured; default:
    # gateway.toml's [lifecycle] expected_load_s. The agent does not use it.
    expected_load_s: PositiveFloat | None = None
    stall_timeout_s: PositiveFloat = 120.0  # ... or when the engine used no CPU for this long while loading
    env: dict[str, str] = {}  # extra environment (values may use placeholders)
    configs: tuple[InstanceConfig, ...] = ()  # instance configurations (see the class docstring)
    default_config: str | None = None  # the configuration a start without --config runs

    @property
    def memory_bytes(self) -> int:
        return round(self.memory_gib * GIB)

    def instance_config(self, name: str | None = None) -> InstanceConfig | None:
        """The configuration `name` (None: the default one); None when the model lists none. Raises
        KeyError for a name it does not list (and for any name when it lists none)."""
        if name is None:
            if not self.configs:
                return None
            name = self.default_config or self.configs[0].name
        for c in self.configs:
            if c.name == name:
                return c
        raise KeyError(name)

    def configured(self, name: str | None = None) -> ModelSpec:
        """The model as an instance of configuration `name` runs it: the configuration's devices and
        memory per device, and `default_config` naming it (itself when it lists none). Raises KeyError
        like `instance_config`."""
        c = self.instance_config(name)
        if c is None:
            return self
        return msgspec.structs.replace(
            self,
            devices=c.devices or self.devices,
            memory_gib=c.memory_gib or self.memory_gib,
            default_config=c.name,
        )

    @property
    def config_names(self) -> list[str]:
        return [c.name for c in self.configs]


class ModelsFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """models.toml."""

    models: tuple[ModelSpec, ...] = ()


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The checked configuration of one node agent (paths absolute)."""

    file: Path
    models_file: Path
    state_dir: Path
    backend: Backend
    port_range: tuple[int, int]
    headroom_bytes: int
    host: str
    advertise_host: str
    nvml: bool
    release_wait_s: float
    stop_timeout_s: float
    systemd_properties: tuple[str, ...]
    devices: tuple[DeviceConfig, ...]
    models: Mapping[str, ModelSpec]


def load_agent_config(path: str | Path) -> AgentConfig:
    """The checked configuration in the agent.toml at `path` and the models.toml it names.

    Raises the first ConfigError found (`agent_config_problems` lists them all).
    """
    cfg, problems = agent_config_problems(path)
    if problems:
        raise problems[0]
    assert cfg is not None
    return cfg


def agent_config_problems(path: str | Path) -> tuple[AgentConfig | None, list[ConfigError]]:
    """The configuration and every cross-reference problem of agent.toml and its models.toml.

    A file that cannot be read, parsed or strictly decoded still raises. The config is None exactly when
    there are problems.
    """
    p = Path(path)
    label = str(path)
    f = convert(read_toml(p, label), AgentFile, label=label)
    problems = [e.within(file=label) for e in check_agent(f)]
    models_path = _absolute(p.parent / Path(f.models).expanduser())
    models: dict[str, ModelSpec] = {}
    if not models_path.is_file():
        what = "is not a file" if models_path.exists() else "not found"
        problems.append(ConfigError(f"models file {what}: {models_path}", path="models", file=label))
    else:
        registry, model_problems = models_file_problems(models_path)
        problems += model_problems
        models = {m.name: m for m in registry.models}
    if problems:
        return None, problems
    host = f.advertise_host or (socket.gethostname() if f.host in ("0.0.0.0", "::") else f.host)
    return (
        AgentConfig(
            file=_absolute(p),
            models_file=models_path,
            state_dir=_absolute(p.parent / Path(f.state_dir).expanduser()),
            backend=f.backend,
            port_range=f.port_range,
            headroom_bytes=round(f.headroom_gib * GIB),
            host=f.host,
            advertise_host=host,
            nvml=f.nvml,
            release_wait_s=f.release_wait_s,
            stop_timeout_s=f.stop_timeout_s,
            systemd_properties=f.systemd_properties,
            devices=tuple(_with_index(d, i) for i, d in enumerate(f.devices)),
            models=models,
        ),
        [],
    )


def models_file_problems(path: str | Path) -> tuple[ModelsFile, list[ConfigError]]:
    """models.toml decoded, and its cross-reference problems (decode errors raise)."""
    label = str(path)
    f = convert(read_toml(Path(path), label), ModelsFile, label=label)
    return f, [e.within(file=label) for e in check_models(f)]


def is_agent_file(path: str | Path, raw: Mapping[str, Any]) -> bool:
    """Whether a parsed TOML file is an agent.toml (for `berth check`): by its keys, or by its name
    (`agent.toml`, `gpu-07-agent.toml`) when the keys cannot tell (an empty file is all defaults)."""
    keys = ("state_dir", "backend", "port_range", "headroom_gib", "devices")
    by_keys = any(k in raw for k in keys) or isinstance(raw.get("models"), str)
    return by_keys or (Path(path).name.endswith("agent.toml") and "models" not in raw)


def is_models_file(path: str | Path, raw: Mapping[str, Any]) -> bool:
    """Whether a parsed TOML file is a models.toml (for `berth check`): [[models]], or by its name."""
    return isinstance(raw.get("models"), list) or (Path(path).name.endswith("models.toml") and not raw)


def check_agent(f: AgentFile) -> list[ConfigError]:
    problems: list[ConfigError] = []
    lo, hi = f.port_range
    if lo > hi:
        problems.append(ConfigError(f"the first port is above the last ({lo} > {hi})", path="port_range"))
    if not f.host:
        problems.append(ConfigError("must not be empty", path="host"))
    for i, prop in enumerate(f.systemd_properties):
        name, eq, _ = prop.partition("=")
        if not eq or not name.strip() or name.strip() in _FIXED_PROPERTIES:
            why = "is set by the agent" if name.strip() in _FIXED_PROPERTIES else "expected NAME=VALUE"
            problems.append(ConfigError(f"{why}: {prop!r}", path=f"systemd_properties[{i}]"))
    seen_names: dict[str, int] = {}
    seen_index: dict[int, int] = {}
    for i, d in enumerate(f.devices):
        if not d.name:
            problems.append(ConfigError("must not be empty", path=f"devices[{i}].name"))
        if d.name in seen_names:
            problems.append(
                ConfigError(
                    f"duplicate device (also devices[{seen_names[d.name]}])", path=f"devices[{i}].name"
                )
            )
        seen_names.setdefault(d.name, i)
        index = _with_index(d, i).index
        assert index is not None
        if index in seen_index:
            problems.append(
                ConfigError(
                    f"duplicate device index {index} (also devices[{seen_index[index]}])",
                    path=f"devices[{i}].index",
                )
            )
        seen_index.setdefault(index, i)
    return problems


def check_models(f: ModelsFile) -> list[ConfigError]:
    problems: list[ConfigError] = []
    seen: dict[str, int] = {}
    for i, m in enumerate(f.models):
        where = f"models[{i}]"
        if not m.name:
            problems.append(ConfigError("must not be empty", path=f"{where}.name"))
        elif m.name in seen:
            problems.append(
                ConfigError(f"duplicate model (also models[{seen[m.name]}])", path=f"{where}.name")
            )
        seen.setdefault(m.name, i)
        if not m.command:
            problems.append(ConfigError("must name the engine's program", path=f"{where}.command"))
        for j, arg in enumerate(m.command):
            problems += [e.within(prefix=f"{where}.command[{j}]") for e in check_template(arg)]
        for key, value in m.env.items():
            problems += [e.within(prefix=f"{where}.env.{key}") for e in check_template(value)]
        if m.command and not any("{port}" in a for a in (*m.command, *m.env.values())):
            problems.append(
                ConfigError(
                    "must pass the engine its port ({port}): engines share the node", path=f"{where}.command"
                )
            )
        if not m.health_path.startswith("/"):
            problems.append(ConfigError("must start with /", path=f"{where}.health_path"))
        if m.expected_load_s is not None and m.expected_load_s > m.load_timeout_s:
            problems.append(
                ConfigError(
                    f"{m.expected_load_s:g}s is more than the model's load_timeout_s "
                    f"({m.load_timeout_s:g}s): every load would time out",
                    path=f"{where}.expected_load_s",
                )
            )
        problems += _check_configs(m, where)
    return problems


def _check_configs(m: ModelSpec, where: str) -> list[ConfigError]:
    """Problems of a model's instance configurations (and of `{max_batch}` without any)."""
    problems: list[ConfigError] = []
    seen: dict[str, int] = {}
    for i, c in enumerate(m.configs):
        if not CONFIG_NAME.match(c.name):
            problems.append(
                ConfigError(f"must match {CONFIG_NAME.pattern}", path=f"{where}.configs[{i}].name")
            )
        elif c.name in seen:
            problems.append(
                ConfigError(
                    f"duplicate configuration (also configs[{seen[c.name]}])",
                    path=f"{where}.configs[{i}].name",
                )
            )
        seen.setdefault(c.name, i)
    if m.default_config is not None and m.default_config not in seen:
        known = ", ".join(seen) or "the model lists no [[models.configs]]"
        problems.append(
            ConfigError(f"names no configuration of the model ({known})", path=f"{where}.default_config")
        )
    if not m.configs:
        for j, arg in enumerate(m.command):
            if "{max_batch}" in arg:
                problems.append(
                    ConfigError(
                        "{max_batch} needs [[models.configs]] (each with max_batch)",
                        path=f"{where}.command[{j}]",
                    )
                )
        for key, value in m.env.items():
            if "{max_batch}" in value:
                problems.append(
                    ConfigError(
                        "{max_batch} needs [[models.configs]] (each with max_batch)",
                        path=f"{where}.env.{key}",
                    )
                )
    return problems


def check_template(text: str) -> list[ConfigError]:
    """Problems of one template string (empty key path: the caller places it)."""
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as e:
        return [ConfigError(f"bad template: {e} (write {{{{ and }}}} for literal braces)")]
    out: list[ConfigError] = []
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            out.append(ConfigError(f"unknown placeholder {shown} (known: {', '.join(PLACEHOLDERS)})"))
    return out


def render(text: str, values: Mapping[str, str]) -> str:
    """A checked template with its placeholders filled (`values` has every name in PLACEHOLDERS)."""
    return text.format_map(values)


def _with_index(d: DeviceConfig, position: int) -> DeviceConfig:
    if d.index is not None:
        return d
    index = position
    if d.name.startswith("gpu") and d.name[3:].isdigit():
        index = int(d.name[3:])
    return msgspec.structs.replace(d, index=index)


def _absolute(p: Path) -> Path:
    return Path(os.path.normpath(p.absolute()))
