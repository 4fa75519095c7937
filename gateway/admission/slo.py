"""Resolve a request's SLO: its class and its targets, and, for a call of a multi-step task, its share of
the task SLA (`gateway.admission.tasks`).

Order (each target comes from the first source that sets it; the class likewise):
1. the request's headers: `x-berth-slo-class`, `x-berth-ttft-ms`, `x-berth-itl-ms`,
   `x-berth-deadline-ms` (and `x-berth-task-id` with `x-berth-task-sla-ms`);
2. the tenant of its API key (`[[tenants]]` in gateway.toml: a default class and targets);
3. the policy's rules (`[[slo.rules]]`: the first whose fields all match picks the class);
4. the policy's default class.
The class supplies the targets nothing above set. A task call's allotted deadline then tightens the
target its position bounds (the first token of a task's last call when the class's task_metric is
`ttft`, else the call's end).

Any header `x-berth-*` that is not one of these, and any malformed value, is a 400 naming the header.
A tenant with `allowed_classes` gets its default class (slo_class, else the first allowed) for a header
naming another class ("downgrade", source "downgraded"), or a 403 slo_class_not_allowed ("reject").
API keys are hashed (SHA-256) on arrival and only the tenant's name is kept or logged.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.admission.limits import NO_LIMITS, TenantLimits
from gateway.admission.tasks import TaskClock
from gateway.config.schema import KeyEntry, TenantConfig
from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.core.slo import SloClass, SloPolicy, SloRule, TaskCall, TaskMetric, UnknownClass
from gateway.core.types import SLO, ParsedRequest

H_CLASS: Final = "x-berth-slo-class"
H_TTFT: Final = "x-berth-ttft-ms"
H_ITL: Final = "x-berth-itl-ms"
H_DEADLINE: Final = "x-berth-deadline-ms"
H_TASK_ID: Final = "x-berth-task-id"
H_TASK_SLA: Final = "x-berth-task-sla-ms"
SLO_HEADERS: Final = (H_CLASS, H_TTFT, H_ITL, H_DEADLINE, H_TASK_ID, H_TASK_SLA)
#: `Resolved.source` of a request whose x-berth-slo-class the policy lacks (served in the default class).
UNKNOWN_CLASS_SOURCE: Final = "unknown-class"
#: `Resolved.source` of a request whose x-berth-slo-class its tenant may not use (served in the tenant's).
DOWNGRADED_SOURCE: Final = "downgraded"
_PREFIX: Final = "x-berth-"
_PREFIX_LEN: Final = len(_PREFIX)
_MAX_MS: Final = 1e9
_MAX_TASK_ID: Final = 128
INVALID_SLO_HEADER: Final = "invalid_slo_header"


def _bad(header: str, problem: str) -> BerthError:
    return errors.bad_request(f"header {header}: {problem}", param=header, code=INVALID_SLO_HEADER)


@dataclass(frozen=True, slots=True)
class SloHeaders:
    slo_class: str | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    deadline_ms: float | None = None
    task_id: str | None = None
    task_sla_ms: float | None = None


NO_SLO_HEADERS: Final = SloHeaders()


def parse_slo_headers(headers: Iterable[tuple[str, str]]) -> SloHeaders:
    """The x-berth-* request headers; 400 naming the header when one is unknown, repeated or malformed."""
    seen: dict[str, str] = {}
    for name, value in headers:
        if name[:_PREFIX_LEN].lower() != _PREFIX:
            continue
        low = name.lower()
        if low not in SLO_HEADERS:
            raise _bad(low, f"unknown header (berth reads {', '.join(SLO_HEADERS)})")
        if low in seen:
            raise _bad(low, "given more than once")
        seen[low] = value.strip()
    if not seen:
        return NO_SLO_HEADERS  # most requests: nothing to parse
    task_id = seen.get(H_TASK_ID)
    if task_id is not None and not (
        0 < len(task_id) <= _MAX_TASK_ID and task_id.isascii() and task_id.isprintable()
    ):
        raise _bad(H_TASK_ID, f"expected 1 to {_MAX_TASK_ID} printable ASCII characters")
    sla = _ms(seen, H_TASK_SLA)
    if sla is not None and task_id is None:
        raise _bad(H_TASK_SLA, f"needs {H_TASK_ID} (the task the SLA belongs to)")
    cls = seen.get(H_CLASS)
    if cls is not None and not cls:
        raise _bad(H_CLASS, "must not be empty")
    return SloHeaders(
        slo_class=cls,
        ttft_ms=_ms(seen, H_TTFT),
        itl_ms=_ms(seen, H_ITL),
        deadline_ms=_ms(seen, H_DEADLINE),
        task_id=task_id,
        task_sla_ms=sla,
    )


def _ms(seen: Mapping[str, str], name: str) -> float | None:
    raw = seen.get(name)
    if raw is None:
        return None
    try:
        v = float(raw)
    except ValueError:
        raise _bad(name, f"expected a number of milliseconds, got {raw[:40]!r}") from None
    if not math.isfinite(v) or v <= 0 or v > _MAX_MS:
        raise _bad(name, f"expected milliseconds > 0 and <= {_MAX_MS:g}, got {raw[:40]!r}")
    return v


# --------------------------------------------------------------------- tenants
@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    slo_class: str | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    deadline_ms: float | None = None
    allowed_classes: tuple[str, ...] = ()  # empty: any
    limits: TenantLimits = NO_LIMITS

    @property
    def default_class(self) -> str | None:
        """The class of a request that names none: slo_class, else the first allowed one."""
        if self.slo_class is not None:
            return self.slo_class
        return self.allowed_classes[0] if self.allowed_classes else None

    def allows(self, slo_class: str) -> bool:
        return not self.allowed_classes or slo_class in self.allowed_classes

    def __repr__(self) -> str:
        return f"Tenant({self.name!r})"


def tenant_of(c: TenantConfig) -> Tenant:
    return Tenant(
        c.name,
        c.slo_class,
        c.ttft_ms,
        c.itl_ms,
        c.deadline_ms,
        c.allowed_classes,
        TenantLimits(c.requests_per_s, c.tokens_per_min, c.max_concurrency),
    )


class Tenants:
    """API key (by its SHA-256) -> tenant.

    A presented key is hashed and the digest looked up in a dict. The lookup's timing depends only on
    the digest, which an attacker cannot steer towards a stored one without a SHA-256 preimage, so this
    is as safe as comparing with `hmac.compare_digest` against every stored digest, and O(1).
    """

    def __init__(self, configs: Sequence[TenantConfig] = (), keys: Sequence[KeyEntry] = ()) -> None:
        self._by_digest: dict[str, Tenant] = {}
        self.by_name: dict[str, Tenant] = {}
        for c in configs:
            t = self.by_name[c.name] = tenant_of(c)
            for key in c.api_keys:
                self._by_digest[_digest(key)] = t
            for h in c.api_key_sha256:
                self._by_digest[h.lower()] = t
        for k in keys:
            tenant = self.by_name.get(k.tenant)
            if tenant is not None:
                self._by_digest[k.sha256.lower()] = tenant

    def __len__(self) -> int:
        return len(self.by_name)

    @property
    def keys(self) -> int:
        return len(self._by_digest)

    def lookup(self, authorization: str | None, api_key: str | None = None) -> Tenant | None:
        """The tenant of `Authorization: Bearer KEY`, else of `api-key: KEY` (the header Azure-style
        SDKs send); None: no key, another scheme, or an unknown key."""
        if not self._by_digest:
            return None  # no keys configured: nothing to look up
        key = presented_key(authorization, api_key)
        if key is None:
            return None
        return self._by_digest.get(_digest(key))


def presented_key(authorization: str | None, api_key: str | None = None) -> str | None:
    """The API key a request presents: `Authorization: Bearer KEY`, else `api-key: KEY`."""
    if authorization:
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() == "bearer" and key:
            return key
    if api_key:
        key = api_key.strip()
        if key:
            return key
    return None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# --------------------------------------------------------------------- rules
def rule_matches(rule: SloRule, parsed: ParsedRequest, served: str) -> bool:
    if rule.model is not None and rule.model not in (parsed.model, served):
        return False
    if rule.path is not None and rule.path != parsed.api.path:
        return False
    if rule.stream is not None and rule.stream != parsed.stream:
        return False
    mt = parsed.max_tokens
    if rule.max_tokens_min is not None and (mt is None or mt < rule.max_tokens_min):
        return False
    if rule.max_tokens_max is not None and (mt is None or mt > rule.max_tokens_max):
        return False
    pc = parsed.prompt_chars
    if rule.prompt_chars_min is not None and pc < rule.prompt_chars_min:
        return False
    if rule.prompt_chars_max is not None and pc > rule.prompt_chars_max:
        return False
    return all(_same(parsed.body.get(k), v) for k, v in rule.body.items())


def _same(got: Any, want: str | int | float | bool) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    return bool(got == want)


# --------------------------------------------------------------------- resolution
@dataclass(frozen=True, slots=True)
class Resolved:
    slo: SLO
    source: str  # what chose the class: header, tenant, rule or default
    tenant: str | None = None
    task_id: str | None = None
    task: TaskCall | None = None


def resolve(
    policy: SloPolicy,
    hdrs: SloHeaders,
    tenant: Tenant | None,
    parsed: ParsedRequest,
    served: str,
    *,
    now: float,
    tasks: TaskClock | None = None,
    reject_disallowed: bool = False,
) -> Resolved:
    """The request's SLO (see the module doc). A class the policy lacks is served in the default class
    (source "unknown-class"), or, when the policy says so, a 400 naming x-berth-slo-class. A class the
    tenant may not use is served in the tenant's default class (source "downgraded"), or, with
    `reject_disallowed`, a 403."""
    cls: SloClass | None = None
    source = "default"
    tenant_class = None if tenant is None else tenant.default_class
    if hdrs.slo_class is not None and tenant is not None and not tenant.allows(hdrs.slo_class):
        if reject_disallowed:
            raise errors.slo_class_not_allowed(hdrs.slo_class, tenant.allowed_classes)
        cls = None if tenant_class is None else policy.get(tenant_class)
        source = DOWNGRADED_SOURCE
    elif hdrs.slo_class is not None:
        cls = policy.get(hdrs.slo_class)
        if cls is not None:
            source = "header"
        elif policy.unknown_class is UnknownClass.REJECT:
            raise _bad(H_CLASS, f"unknown SLO class {hdrs.slo_class!r} (known: {', '.join(policy.classes)})")
        else:
            source = UNKNOWN_CLASS_SOURCE
    elif tenant_class is not None and tenant_class in policy.classes:
        cls = policy.classes[tenant_class]
        source = "tenant"
    else:
        for rule in policy.rules:
            if rule_matches(rule, parsed, served):
                cls = policy.classes[rule.slo_class]
                source = "rule"
                break
    if cls is None:
        cls = policy.classes[policy.default_class]
    ttft = _first(hdrs.ttft_ms, None if tenant is None else tenant.ttft_ms, cls.ttft_ms)
    itl = _first(hdrs.itl_ms, None if tenant is None else tenant.itl_ms, cls.itl_ms)
    e2e = _first(hdrs.deadline_ms, None if tenant is None else tenant.deadline_ms, cls.e2e_ms)
    call: TaskCall | None = None
    if hdrs.task_id is not None and tasks is not None:
        key = f"{'' if tenant is None else tenant.name}\x00{hdrs.task_id}"
        call = tasks.call(key, now, cls, hdrs.task_sla_ms)
        if call.deadline is not None:
            allotted = (call.deadline - now) * 1000.0
            if call.metric is TaskMetric.TTFT:
                ttft = allotted if ttft is None else min(ttft, allotted)
            else:
                e2e = allotted if e2e is None else min(e2e, allotted)
    return Resolved(
        slo=SLO(slo_class=cls.name, ttft_ms=ttft, itl_ms=itl, deadline_ms=e2e),
        source=source,
        tenant=None if tenant is None else tenant.name,
        task_id=hdrs.task_id,
        task=call,
    )


def _first(*values: float | None) -> float | None:
    for v in values:
        if v is not None:
            return v
    return None
