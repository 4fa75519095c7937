"""[cluster] of gateway.toml (static): several berth replicas sharing state through one Redis.

    [cluster]
    redis = "redis://redis.internal:6379/0"   # or rediss:// (TLS); a user name may be in the URL
    password_env = "BERTH_REDIS_PASSWORD"     # or password_file = "redis.pass" (mode 0600): never in the URL
    name = "gw-1"                             # default: $BERTH_CLUSTER_NAME, else the host name

Without [cluster] nothing here is built and nothing is contacted. The password is read like an engine's
API key (`api_key_env` / `api_key_file`) and is never part of a log line, a metric or a repr; the URL as
shown anywhere is `ClusterSetup.safe_url` (no password, ever).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Final, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from gateway.config.secrets import Secret, read_secret
from gateway.core.errors import ConfigError

#: The replica's name from the environment, over [cluster] name (the systemd template unit sets it per
#: instance: several replicas may share one gateway.toml on one host).
NAME_ENV: Final = "BERTH_CLUSTER_NAME"
# The beat: a replica's load at most this old on the others (3 replicas within 0.01 of one gateway on
# the fleet simulator at 0.1 s, about 0.02 at 0.5 s: docs/cluster.md), 10 background calls a second.
PUBLISH_INTERVAL_S: Final = 0.1
PositiveFloat = Annotated[float, Meta(gt=0)]
Timeout = Annotated[float, Meta(gt=0, le=60)]


class ClusterConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """[cluster] exactly as written."""

    redis: str  # redis://[user@]host:port/db or rediss://...
    # This replica's name, unique in the cluster ($BERTH_CLUSTER_NAME wins; default: the host name).
    name: str = ""
    password_env: str | None = None  # environment variable holding the Redis password
    password_file: str | None = None  # file holding it (mode 0600); relative to gateway.toml
    key_prefix: str = "berth"  # every key berth writes starts with "{prefix}:"
    # Every Redis call gives up after this long; the piece that made it falls back (docs/cluster.md).
    timeout_s: Timeout = 0.25
    connect_timeout_s: Timeout = 1.0  # connecting to Redis (a new connection after a failure included)
    # Members' and the leader's leases: a replica unseen this long is gone (its seats return), a leader
    # that did not renew this long is replaced.
    lease_s: Annotated[float, Meta(ge=0.2, le=600)] = 5.0
    # How often a replica renews its lease, publishes its endpoint load and reads the others'.
    publish_interval_s: Annotated[float, Meta(ge=0.01, le=60)] = PUBLISH_INTERVAL_S
    # Tenant limits while Redis does not answer: "local" enforces 1/replicas of each limit on this
    # replica; "refuse" answers 503 limits_unavailable to tenants that have limits.
    on_redis_down: Literal["local", "refuse"] = "local"
    # The URL the other replicas reach this one at (they pass it requests for the files and batches it
    # holds: docs/batch.md). Default: http://[server] listen, the host name for a wildcard address.
    advertise_url: str = ""
    # Tenant limits large enough (each at least 2 / slice_share): a replica takes this share of a limit
    # from Redis in one call and spends it locally (admission without a Redis round trip); 0: every
    # decision is one script call (exact). docs/cluster.md states the bounded error.
    slice_share: Annotated[float, Meta(ge=0, le=0.25)] = 0.02


class ClusterSecret(Secret):
    """The Redis password; its repr and str hide it."""

    __slots__ = ()


class ClusterSetup(msgspec.Struct, frozen=True, kw_only=True):
    """[cluster] checked: the replica's name resolved and the password read."""

    config: ClusterConfig
    name: str
    password: ClusterSecret | None = None

    @property
    def safe_url(self) -> str:
        """The Redis URL for logs and the admin API: scheme, host, port and db only."""
        return safe_url(self.config.redis)

    def __repr__(self) -> str:
        return f"ClusterSetup(name={self.name!r}, redis={self.safe_url!r}, password=<hidden>)"


def advertised_url(c: ClusterConfig, listen: tuple[str, int]) -> str:
    """Where the other replicas reach this one: [cluster] advertise_url, else http://HOST:PORT of [server]
    listen (the host name for a wildcard address, which no peer can reach)."""
    if c.advertise_url:
        return c.advertise_url.rstrip("/")
    host, port = listen
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def safe_url(url: str) -> str:
    try:
        p = urlsplit(url)
        host = p.hostname or ""
        port = p.port
    except ValueError:
        return "<invalid>"
    if ":" in host:
        host = f"[{host}]"
    return f"{p.scheme}://{host}{'' if port is None else f':{port}'}{p.path}"


def cluster_problems(
    c: ClusterConfig | None, *, base: Path, env: Mapping[str, str]
) -> tuple[ClusterSetup | None, list[ConfigError]]:
    """[cluster] checked (key paths relative to the file); None when absent or wrong."""
    if c is None:
        return None, []
    problems: list[ConfigError] = []
    try:
        p = urlsplit(c.redis)
        _ = p.port  # raises on a bad port
    except ValueError as e:
        return None, [ConfigError(f"not a URL: {e}", path="cluster.redis")]
    if p.scheme not in ("redis", "rediss") or not p.hostname:
        problems.append(ConfigError("must be redis://HOST[:PORT][/DB] or rediss://...", path="cluster.redis"))
    if p.password is not None:
        problems.append(
            ConfigError(
                "must not hold the password: set cluster.password_env or cluster.password_file",
                path="cluster.redis",
            )
        )
    db = p.path.strip("/")
    if db and not db.isdigit():
        problems.append(ConfigError(f"the database must be a number, not {db!r}", path="cluster.redis"))
    if p.query or p.fragment:
        problems.append(ConfigError("must have no query or fragment", path="cluster.redis"))
    if c.publish_interval_s * 2 > c.lease_s:
        problems.append(
            ConfigError(
                f"must be at most half of cluster.lease_s ({c.lease_s:g}): a lease renewed less often "
                "expires between renewals",
                path="cluster.publish_interval_s",
            )
        )
    if c.advertise_url:
        a = urlsplit(c.advertise_url)
        if a.scheme not in ("http", "https") or not a.hostname or a.path.strip("/") or a.query:
            problems.append(
                ConfigError("must be http(s)://HOST[:PORT], without a path", path="cluster.advertise_url")
            )
    if not c.key_prefix or any(ch.isspace() or ch in "{}" for ch in c.key_prefix):
        problems.append(ConfigError("must be non-empty, without spaces or braces", path="cluster.key_prefix"))
    name = env.get(NAME_ENV) or c.name or socket.gethostname()
    if not name or any(ch.isspace() for ch in name) or len(name) > 128:
        problems.append(ConfigError("must be 1-128 characters without spaces", path="cluster.name"))
    if c.password_env is not None and c.password_file is not None:
        problems.append(
            ConfigError("set password_env or password_file, not both", path="cluster.password_file")
        )
    password: ClusterSecret | None = None
    try:
        password = _read_password(c, base, env)
    except ConfigError as e:
        problems.append(e)
    if problems:
        return None, problems
    return ClusterSetup(config=c, name=name, password=password), []


def _read_password(c: ClusterConfig, base: Path, env: Mapping[str, str]) -> ClusterSecret | None:
    """The password from password_env or password_file (a file others may read is refused)."""
    return read_secret(
        ClusterSecret,
        env_var=c.password_env,
        file=c.password_file,
        base=base,
        env=env,
        env_path="cluster.password_env",
        file_path="cluster.password_file",
        what="password",
    )
