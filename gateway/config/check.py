"""`berth check -c FILE`: validate a gateway.toml (and the policy it names), a policy file, or the node
agent's agent.toml (and the models.toml it names) or models.toml."""

from __future__ import annotations

from pathlib import Path

from gateway.agent.config import agent_config_problems, is_agent_file, is_models_file, models_file_problems
from gateway.config.load import gateway_config_problems, load_configured_policy
from gateway.config.policy import build_policy, decode_policy, is_policy_table
from gateway.config.validate import check_tenant_classes
from gateway.core.errors import ConfigError
from gateway.core.strict_toml import read_toml
from gateway.sched.plugins import default_registry
from gateway.sched.registry import PluginRegistry


def check(path: str | Path, registry: PluginRegistry | None = None) -> list[str]:
    """[] when `path` loads cleanly, else one `FILE:KEY.PATH: message` line per problem.

    A file with a top-level `ordering` or `placement` table is checked as a policy file; one with an
    array of `[[models]]` as a models.toml; one with agent keys (`state_dir`, `backend`, `devices`, ...)
    or named `*agent.toml` as an agent.toml with its models.toml; anything else as a gateway.toml with
    the policy file it names.
    """
    reg = registry if registry is not None else default_registry()
    label = str(path)
    try:
        raw = read_toml(Path(path), label)
        if is_policy_table(raw):
            build_policy(decode_policy(raw, label), label, reg, stem=Path(path).stem)
            return []
        if is_models_file(path, raw):
            return [str(p) for p in models_file_problems(path)[1]]
        if is_agent_file(path, raw):
            return [str(p) for p in agent_config_problems(path)[1]]
        cfg, problems = gateway_config_problems(path)
        if cfg is None:
            return [str(p) for p in problems]
        policy = load_configured_policy(cfg, reg)
    except ConfigError as e:
        return [str(e)]
    return [str(p.within(file=str(path))) for p in check_tenant_classes(cfg.tenants, policy.slo)]
