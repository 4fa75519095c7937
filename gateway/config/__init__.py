"""Configuration: gateway.toml (static + reloadable sections) and policy files, strictly checked.

Pipeline (each stage in its own module): strict decode (`gateway.core.strict_toml`, `schema`,
`policy`) -> defaults and cross-reference checks (`load`, `validate`) -> build (`policy`, `runtime`).
Every error is a `gateway.core.errors.ConfigError` whose str is `FILE:KEY.PATH: message`.
Command-line overrides live in `cli_overrides`; the reload transaction in `runtime`; `berth check` in `check`.
"""

from gateway.config.check import check
from gateway.config.cli_overrides import apply_overrides, parse_endpoint_flag
from gateway.config.load import (
    ADMIN_TOKEN_ENV,
    default_config,
    load_configured_policy,
    load_gateway_config,
)
from gateway.config.policy import load_default_policy, load_policy, parse_policy_text
from gateway.config.runtime import RuntimeConfig, load_runtime
from gateway.config.schema import (
    EndpointConfig,
    GatewayConfig,
    LimitsConfig,
    ScrapeConfig,
    ServerConfig,
    UpstreamConfig,
)

__all__ = [
    "ADMIN_TOKEN_ENV",
    "EndpointConfig",
    "GatewayConfig",
    "LimitsConfig",
    "RuntimeConfig",
    "ScrapeConfig",
    "ServerConfig",
    "UpstreamConfig",
    "apply_overrides",
    "check",
    "default_config",
    "load_configured_policy",
    "load_default_policy",
    "load_gateway_config",
    "load_policy",
    "load_runtime",
    "parse_endpoint_flag",
    "parse_policy_text",
]
