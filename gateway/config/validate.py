"""Checks that a strict decode cannot make: URLs, `listen`, names, and how values relate to each other.

Each check returns every problem it finds (a ConfigError with a key path, no file yet) so `berth check`
can show them all at once; loaders raise the first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.config.schema import BatchConfig, EndpointConfig, GatewayFile, KeyEntry, TenantConfig
from gateway.core.errors import ConfigError
from gateway.core.slo import SloPolicy
from gateway.core.strict_toml import join_path


def check_gateway(f: GatewayFile) -> list[ConfigError]:
    """Every cross-reference problem of a decoded gateway.toml (key paths relative to the file)."""
    problems: list[ConfigError] = []
    listen = check_listen(f.server.listen)
    if listen:
        problems.append(ConfigError(listen, path="server.listen"))
    if f.upstream.pool_per_host > f.upstream.pool_total:
        problems.append(
            ConfigError(
                f"must not exceed upstream.pool_total ({f.upstream.pool_total})",
                path="upstream.pool_per_host",
            )
        )
    if f.scrape.stale_after_s < f.scrape.interval_s:
        problems.append(
            ConfigError(
                f"must be at least scrape.interval_s ({f.scrape.interval_s}), "
                "or every scrape is stale before the next one",
                path="scrape.stale_after_s",
            )
        )
    tel = f.telemetry
    if tel.first_fit_min_observations > tel.min_observations:
        problems.append(
            ConfigError(
                f"must not exceed telemetry.min_observations ({tel.min_observations}; lower both)",
                path="telemetry.first_fit_min_observations",
            )
        )
    if tel.first_fit_interval_s > tel.refit_interval_s:
        problems.append(
            ConfigError(
                f"must not exceed telemetry.refit_interval_s ({tel.refit_interval_s}): "
                "every refit fits the parts on the prior too (lower both)",
                path="telemetry.first_fit_interval_s",
            )
        )
    problems.extend(check_aliases(f.aliases))
    for i, ep in enumerate(f.endpoints):
        problems.extend(e.within(prefix=f"endpoints[{i}]") for e in check_endpoint(ep))
    if f.ops.listen:
        ops = check_listen(f.ops.listen)
        if ops:
            problems.append(ConfigError(ops, path="ops.listen"))
        elif f.ops.listen == f.server.listen:
            problems.append(ConfigError("must differ from server.listen", path="ops.listen"))
    if f.auth.required and not f.tenants:
        problems.append(
            ConfigError("no [[tenants]] are configured, so every request would get 401", path="auth.required")
        )
    problems.extend(check_tenants(f.tenants, keys_file=bool(f.auth.keys_file)))
    for d in duplicate_endpoints(f.endpoints):
        problems.append(
            ConfigError(
                f"{d.describe()} (already used by endpoints[{d.first}])", path=f"endpoints[{d.index}].{d.key}"
            )
        )
    return problems


def check_tenants(tenants: Sequence[TenantConfig], *, keys_file: bool = False) -> list[ConfigError]:
    """Names unique and blank-free, key hashes 64 hex digits, no key in two places, a default class
    among the allowed ones. Messages never repeat a key or a hash (they are secrets, and end up in
    logs). With a keys file a tenant may have no keys in gateway.toml."""
    problems: list[ConfigError] = []
    names: dict[str, int] = {}
    seen: dict[str, int] = {}
    for i, t in enumerate(tenants):
        where = f"tenants[{i}]"
        if not _is_name(t.name):
            problems.append(
                ConfigError(f"must be non-empty without whitespace, got {t.name!r}", path=f"{where}.name")
            )
        elif t.name in names:
            problems.append(
                ConfigError(
                    f"duplicate tenant {t.name!r} (already tenants[{names[t.name]}])", path=f"{where}.name"
                )
            )
        else:
            names[t.name] = i
        if not t.api_keys and not t.api_key_sha256 and not keys_file:
            problems.append(
                ConfigError("a tenant needs api_keys or api_key_sha256 (or auth.keys_file)", path=where)
            )
        if t.allowed_classes and t.slo_class is not None and t.slo_class not in t.allowed_classes:
            problems.append(
                ConfigError(
                    f"slo_class {t.slo_class!r} is not among allowed_classes", path=f"{where}.slo_class"
                )
            )
        digests: list[tuple[str, str]] = []
        for j, key in enumerate(t.api_keys):
            if not key or any(c.isspace() for c in key):
                problems.append(
                    ConfigError(
                        "an API key must be non-empty without whitespace", path=f"{where}.api_keys[{j}]"
                    )
                )
                continue
            digests.append((f"{where}.api_keys[{j}]", hashlib.sha256(key.encode()).hexdigest()))
        for j, h in enumerate(t.api_key_sha256):
            if len(h) != 64 or any(c not in "0123456789abcdefABCDEF" for c in h):
                problems.append(
                    ConfigError(
                        "expected 64 hexadecimal digits (sha256sum of the key)",
                        path=f"{where}.api_key_sha256[{j}]",
                    )
                )
                continue
            digests.append((f"{where}.api_key_sha256[{j}]", h.lower()))
        for path, digest in digests:
            if digest in seen:
                problems.append(
                    ConfigError(f"the same API key is already given in tenants[{seen[digest]}]", path=path)
                )
            else:
                seen[digest] = i
    return problems


def check_keys(keys: Sequence[KeyEntry], tenants: Sequence[TenantConfig]) -> list[ConfigError]:
    """The auth keys file's entries (key paths relative to that file): a known tenant, a SHA-256 in
    hex, no key given twice (here or in gateway.toml's [[tenants]]). Never repeats a hash."""
    problems: list[ConfigError] = []
    names = {t.name for t in tenants}
    seen: dict[str, str] = {}
    for t in tenants:
        for key in t.api_keys:
            seen.setdefault(hashlib.sha256(key.encode()).hexdigest(), f"tenant {t.name!r} in gateway.toml")
        for h in t.api_key_sha256:
            seen.setdefault(h.lower(), f"tenant {t.name!r} in gateway.toml")
    for i, k in enumerate(keys):
        where = f"keys[{i}]"
        if k.tenant not in names:
            known = ", ".join(sorted(names)) or "none"
            problems.append(
                ConfigError(
                    f"unknown tenant {k.tenant!r} (gateway.toml's tenants: {known})", path=f"{where}.tenant"
                )
            )
        h = k.sha256.lower()
        if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            problems.append(
                ConfigError("expected 64 hexadecimal digits (sha256sum of the key)", path=f"{where}.sha256")
            )
            continue
        if h in seen:
            problems.append(
                ConfigError(f"the same API key is already given for {seen[h]}", path=f"{where}.sha256")
            )
        else:
            seen[h] = where
    return problems


def check_batch_class(batch: BatchConfig, slo: SloPolicy) -> list[ConfigError]:
    """[batch] slo_class must be a class of the policy in force (checked when both are loaded)."""
    if not batch.slo_class or batch.slo_class in slo.classes:
        return []
    known = ", ".join(slo.classes)
    return [
        ConfigError(
            f"unknown SLO class {batch.slo_class!r} (the policy defines: {known})", path="batch.slo_class"
        )
    ]


def check_tenant_classes(tenants: Sequence[TenantConfig], slo: SloPolicy) -> list[ConfigError]:
    """A tenant's slo_class and allowed_classes must be classes of the policy in force (checked when
    both are loaded)."""
    known = ", ".join(slo.classes)
    problems = [
        ConfigError(
            f"unknown SLO class {t.slo_class!r} (the policy defines: {known})", path=f"tenants[{i}].slo_class"
        )
        for i, t in enumerate(tenants)
        if t.slo_class is not None and t.slo_class not in slo.classes
    ]
    for i, t in enumerate(tenants):
        for j, cls in enumerate(t.allowed_classes):
            if cls not in slo.classes:
                problems.append(
                    ConfigError(
                        f"unknown SLO class {cls!r} (the policy defines: {known})",
                        path=f"tenants[{i}].allowed_classes[{j}]",
                    )
                )
    return problems


def check_listen(listen: str) -> str:
    """Why `listen` is not HOST:PORT, or "" when it is."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host:
        return f"expected HOST:PORT, got {listen!r}"
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        return f"expected HOST:PORT with an IPv6 host in brackets ([::1]:8080), got {listen!r}"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"port must be a number from 0 to 65535, got {listen!r}"
    return ""


def check_url(url: str) -> str:
    """Why `url` is not an http(s) base URL of an engine, or "" when it is."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"invalid URL {url!r}: {e}"
    if parts.scheme not in ("http", "https"):
        return f"expected an http:// or https:// URL, got {url!r}"
    if not parts.hostname:
        return f"URL has no host: {url!r}"
    if parts.query or parts.fragment:
        return f"URL must not have a query or fragment: {url!r}"
    if port == 0:
        return f"URL port must not be 0: {url!r}"
    return ""


def check_endpoint(ep: EndpointConfig) -> list[ConfigError]:
    """Problems of one endpoint on its own (key paths relative to the endpoint)."""
    problems: list[ConfigError] = []
    url = check_url(ep.url)
    if url:
        problems.append(ConfigError(url, path="url"))
    if ep.id is not None and not _is_name(ep.id):
        problems.append(ConfigError(f"must be non-empty without whitespace, got {ep.id!r}", path="id"))
    if ep.node is not None and not _is_name(ep.node):
        problems.append(ConfigError(f"must be non-empty without whitespace, got {ep.node!r}", path="node"))
    for i, model in enumerate(ep.models):
        if not model.strip():
            problems.append(ConfigError("model name must not be empty", path=f"models[{i}]"))
    if ep.api_key_env is not None and ep.api_key_file is not None:
        problems.append(ConfigError("give api_key_env or api_key_file, not both", path="api_key_file"))
    if ep.api_key_env is not None and not _is_name(ep.api_key_env):
        problems.append(
            ConfigError(
                "expected the name of an environment variable (never the key itself)", path="api_key_env"
            )
        )
    if ep.api_key_file is not None and not ep.api_key_file.strip():
        problems.append(ConfigError("must not be empty", path="api_key_file"))
    for key, address in (("kv_events", ep.kv_events), ("kv_events_replay", ep.kv_events_replay)):
        problem = None if address is None else check_zmq_address(address)
        if problem:
            problems.append(ConfigError(problem, path=key))
    if ep.kv_events_replay is not None and ep.kv_events is None:
        problems.append(
            ConfigError("a replay socket needs kv_events (the publisher) too", path="kv_events_replay")
        )
    return problems


def check_zmq_address(address: str) -> str | None:
    """Why `address` is not a ZMQ address berth can connect to ("tcp://HOST:PORT" or "ipc://PATH"),
    or None."""
    if address.startswith("ipc://") and len(address) > len("ipc://"):
        return None
    if not address.startswith("tcp://"):
        return f"expected tcp://HOST:PORT (or ipc://PATH), got {address!r}"
    host, sep, port = address[len("tcp://") :].rpartition(":")
    if not sep or not host or "*" in host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"expected tcp://HOST:PORT with a host berth can reach and a port 1-65535, got {address!r}"
    return None


def check_aliases(aliases: dict[str, str]) -> list[ConfigError]:
    problems: list[ConfigError] = []
    for alias, target in aliases.items():
        path = join_path("aliases", [alias])
        if not alias.strip():
            problems.append(ConfigError("alias name must not be empty", path=path))
        elif not target.strip():
            problems.append(ConfigError("alias target must not be empty", path=path))
        elif target == alias:
            problems.append(ConfigError(f"alias {alias!r} points at itself", path=path))
        elif target in aliases:
            problems.append(
                ConfigError(
                    f"alias target {target!r} is itself an alias; point at the engine's served name",
                    path=path,
                )
            )
    return problems


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Endpoint `index` repeats the `key` ("id" or "url") of endpoint `first`."""

    first: int
    index: int
    key: str
    value: str
    derived: bool = False  # the id was not written but derived from the url

    def describe(self) -> str:
        text = f"duplicate endpoint {self.key} {self.value!r}"
        return f"{text}, derived from its url; set id explicitly" if self.derived else text


def duplicate_endpoints(endpoints: Sequence[EndpointConfig]) -> list[Duplicate]:
    """Endpoints that repeat an earlier one's id or URL (a repeated URL is not reported again as id)."""
    out: list[Duplicate] = []
    seen_ids: dict[str, int] = {}
    seen_urls: dict[str, int] = {}
    for i, ep in enumerate(endpoints):
        url = _url_key(ep.url)
        if url in seen_urls:
            out.append(Duplicate(seen_urls[url], i, "url", ep.url))
            continue
        seen_urls[url] = i
        eid = ep.endpoint_id
        if eid in seen_ids:
            out.append(Duplicate(seen_ids[eid], i, "id", eid, derived=ep.id is None))
            continue
        seen_ids[eid] = i
    return out


def _url_key(url: str) -> str:
    """`url` normalised for comparison: case of scheme and host, default port, trailing slash."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url
    if port is None:
        port = 443 if parts.scheme.lower() == "https" else 80
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}{parts.path.rstrip('/')}"


def _is_name(value: str) -> bool:
    return bool(value) and not any(c.isspace() for c in value)
