"""`berth check -c FILE`: validate a gateway.toml (and the policy it names), a policy file, or the node
agent's agent.toml (and the models.toml it names) or models.toml, reporting every problem in one run
rather than the first (for agent.toml and models.toml: every cross-reference problem, the first decode
problem).

Which kind of file it is comes from its top-level keys: `ordering` or `placement` make a policy file,
an array of `[[models]]` a models.toml, agent keys (or the name `*agent.toml`) an agent.toml, any key
of gateway.toml a gateway config. An empty file, or one with none of these keys, is refused as no
known kind (`berth serve -c` refuses an empty file too: no endpoints). A gateway config without
[[endpoints]] passes, with a note: it serves only with `--endpoint` flags.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec.structs

from gateway.agent.config import agent_config_problems, is_agent_file, is_models_file, models_file_problems
from gateway.config.load import gateway_config_problems
from gateway.config.policy import (
    POLICY_MARKERS,
    decode_policy_all,
    is_policy_table,
    load_default_policy,
    policy_problems,
)
from gateway.config.schema import GatewayConfig, GatewayFile
from gateway.config.validate import check_batch_class, check_tenant_classes
from gateway.core.errors import ConfigError
from gateway.core.slo import SloPolicy
from gateway.core.strict_toml import read_toml
from gateway.sched.plugins import default_registry
from gateway.sched.profile import Policy
from gateway.sched.registry import PluginRegistry

#: The top-level keys of gateway.toml.
GATEWAY_KEYS: Final = tuple(f.encode_name for f in msgspec.structs.fields(GatewayFile))
#: What `berth serve -c FILE` says of a file without endpoints (and no --endpoint flags).
NO_ENDPOINTS: Final = "no endpoints: give --endpoint URL or list [[endpoints]] in the config file"


class FileKind(enum.StrEnum):
    GATEWAY = "gateway config"
    POLICY = "policy file"
    AGENT = "agent config"
    MODELS = "models file"
    UNKNOWN = "not a gateway config, policy, agent or models file"


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What `berth check` found: the kind of file, each problem as `FILE:KEY.PATH: message`, and the
    policy file a gateway config names (None: the packaged default, or not a gateway config)."""

    kind: FileKind
    problems: list[str]
    policy_file: Path | None = None
    endpoints: int | None = None  # a gateway config's [[endpoints]]

    def summary(self, path: str | Path) -> str:
        """One line that says which kind of file was checked: `FILE: ok (gateway config; policy FILE)`,
        `FILE: 3 problems (policy file)`."""
        what = str(self.kind)
        if self.kind is FileKind.GATEWAY:
            what += f"; policy {self.policy_file}" if self.policy_file else "; the packaged default policy"
            if self.endpoints == 0:
                what += "; no [[endpoints]]: berth serve needs --endpoint flags"
        if not self.problems:
            return f"{path}: ok ({what})"
        n = len(self.problems)
        return f"{path}: {n} problem{'s' if n != 1 else ''} ({what})"


def check(path: str | Path, registry: PluginRegistry | None = None) -> list[str]:
    """[] when `path` loads cleanly, else one `FILE:KEY.PATH: message` line per problem."""
    return check_file(path, registry).problems


def check_file(path: str | Path, registry: PluginRegistry | None = None) -> CheckReport:
    """Check the file at `path` as whichever kind it is (see the module docstring)."""
    reg = registry if registry is not None else default_registry()
    label = str(path)
    try:
        raw = read_toml(Path(path), label)
    except ConfigError as e:
        return CheckReport(FileKind.UNKNOWN, [str(e)])
    if is_policy_table(raw):
        _, problems = _policy(raw, label, reg, stem=Path(path).stem)
        return CheckReport(FileKind.POLICY, [str(p) for p in problems])
    if is_models_file(path, raw):
        return _node_file(FileKind.MODELS, lambda: models_file_problems(path)[1])
    if is_agent_file(path, raw):
        return _node_file(FileKind.AGENT, lambda: agent_config_problems(path)[1])
    if not raw or not any(k in GATEWAY_KEYS for k in raw):
        return CheckReport(FileKind.UNKNOWN, [_neither(raw, label)])
    return _gateway(path, reg)


def _node_file(kind: FileKind, problems: Callable[[], list[ConfigError]]) -> CheckReport:
    """An agent.toml or models.toml: its decode still stops at the first problem."""
    try:
        return CheckReport(kind, [str(p) for p in problems()])
    except ConfigError as e:
        return CheckReport(kind, [str(e)])


def _gateway(path: str | Path, registry: PluginRegistry) -> CheckReport:
    label = str(path)
    try:
        cfg, problems = gateway_config_problems(path)
    except ConfigError as e:  # pragma: no cover - read and parsed once already
        return CheckReport(FileKind.GATEWAY, [str(e)])
    slo = _policy_slo(cfg, registry, problems)
    if cfg is None:
        return CheckReport(FileKind.GATEWAY, [str(p) for p in problems])
    if slo is not None:
        problems += [p.within(file=label) for p in check_tenant_classes(cfg.tenants, slo)]
        problems += [p.within(file=label) for p in check_batch_class(cfg.batch, slo)]
    return CheckReport(FileKind.GATEWAY, [str(p) for p in problems], cfg.policy_file, len(cfg.endpoints))


def _policy_slo(
    cfg: GatewayConfig | None, registry: PluginRegistry, out: list[ConfigError]
) -> SloPolicy | None:
    """The SLO policy of the policy file `cfg` names, its problems added to `out`; None when it has
    problems or cannot be read (a missing file is already one of the gateway config's problems)."""
    if cfg is None:
        return None
    if cfg.policy_file is None:
        return load_default_policy(registry).slo
    if not cfg.policy_file.is_file():
        return None
    label = str(cfg.policy_file)
    try:
        raw = read_toml(cfg.policy_file, label)
    except ConfigError as e:
        out.append(e)
        return None
    policy, problems = _policy(raw, label, registry, stem=cfg.policy_file.stem)
    out += problems
    return policy.slo if policy is not None else None


def _policy(
    raw: dict[str, Any], label: str, registry: PluginRegistry, *, stem: str
) -> tuple[Policy | None, list[ConfigError]]:
    """Every problem of a policy file: its decode's, then (of what decoded) its build's."""
    decoded = decode_policy_all(raw, label)
    if decoded.value is None:
        return None, decoded.problems
    policy, problems = policy_problems(decoded.value, label, registry, stem=stem)
    return policy, [*decoded.problems, *(p for p in problems if decoded.untouched(p))]


def _neither(raw: dict[str, Any], label: str) -> str:
    if not raw:  # as a gateway config (all defaults), `berth serve -c FILE` refuses it for this
        return str(ConfigError(f"empty file (berth serve: {NO_ENDPOINTS})", file=label))
    expected = (
        f"a gateway config has some of: {', '.join(GATEWAY_KEYS)}; "
        f"a policy file has {' and '.join(sorted(POLICY_MARKERS))}; a models file has [[models]]; "
        "an agent config has state_dir, backend, devices, ..."
    )
    keys = ", ".join(sorted(raw))
    return str(ConfigError(f"{FileKind.UNKNOWN}: unknown top-level keys {keys} ({expected})", file=label))
