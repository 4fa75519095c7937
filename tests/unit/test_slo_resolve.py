"""SLO resolution: headers, then the API key's tenant, then policy rules, then the default class; header
errors are 400s that name the header; tenants are found by key or key hash and never shown."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

from gateway.admission.slo import (
    INVALID_SLO_HEADER,
    NO_SLO_HEADERS,
    UNKNOWN_CLASS_SOURCE,
    SloHeaders,
    Tenant,
    Tenants,
    parse_slo_headers,
    resolve,
    rule_matches,
)
from gateway.admission.state import SloAdmission
from gateway.admission.tasks import TaskClock
from gateway.config.schema import TenantConfig
from gateway.core.errors import BerthError
from gateway.core.slo import SloClass, SloKind, SloPolicy, SloRule, TaskMetric, UnknownClass
from gateway.core.types import ApiKind, ParsedRequest

POLICY = SloPolicy(
    classes={
        "chat": SloClass("chat", ttft_ms=1000.0, itl_ms=100.0),
        "batch": SloClass("batch", kind=SloKind.BATCH, ttft_ms=60000.0, e2e_ms=600000.0),
        "ide": SloClass("ide", ttft_ms=300.0),
        "gen": SloClass(
            "gen", task_sla_ms=10000.0, task_metric=TaskMetric.TTFT, steps=(3.0, 1.0), e2e_ms=50000.0
        ),
    },
    default_class="chat",
    rules=(
        SloRule("batch", path="/v1/completions", max_tokens_min=1000),
        SloRule("ide", model="coder", stream=True),
        SloRule("batch", body={"user": "nightly"}),
    ),
)


def parsed(
    *,
    api: ApiKind = ApiKind.CHAT,
    model: str = "m",
    stream: bool = False,
    max_tokens: int | None = None,
    body: dict[str, Any] | None = None,
    prompt_chars: int = 100,
) -> ParsedRequest:
    return ParsedRequest(
        api=api,
        body={"model": model, **(body or {})},
        model=model,
        stream=stream,
        include_usage=False,
        max_tokens=max_tokens,
        prompt_chars=prompt_chars,
    )


def run(
    headers: dict[str, str] | None = None,
    tenant: Tenant | None = None,
    req: ParsedRequest | None = None,
    *,
    now: float = 100.0,
    tasks: TaskClock | None = None,
) -> Any:
    hdrs = parse_slo_headers((headers or {}).items())
    return resolve(POLICY, hdrs, tenant, req or parsed(), "m-served", now=now, tasks=tasks)


# --------------------------------------------------------------------- order
@pytest.mark.parametrize(
    ("headers", "tenant", "req", "cls", "source"),
    [
        pytest.param({}, None, parsed(), "chat", "default", id="default-class"),
        pytest.param(
            {},
            None,
            parsed(api=ApiKind.COMPLETION, max_tokens=2000),
            "batch",
            "rule",
            id="rule-path-max-tokens",
        ),
        pytest.param(
            {}, None, parsed(api=ApiKind.COMPLETION, max_tokens=10), "chat", "default", id="rule-miss"
        ),
        pytest.param({}, None, parsed(model="coder", stream=True), "ide", "rule", id="rule-model-stream"),
        pytest.param({}, None, parsed(body={"user": "nightly"}), "batch", "rule", id="rule-body-field"),
        pytest.param(
            {},
            Tenant("t", slo_class="ide"),
            parsed(body={"user": "nightly"}),
            "ide",
            "tenant",
            id="tenant-over-rule",
        ),
        pytest.param(
            {"x-berth-slo-class": "batch"},
            Tenant("t", slo_class="ide"),
            parsed(),
            "batch",
            "header",
            id="header-over-tenant",
        ),
        pytest.param(
            {"X-Berth-SLO-Class": "gen"}, None, parsed(), "gen", "header", id="header-case-insensitive"
        ),
        pytest.param({}, Tenant("t"), parsed(), "chat", "default", id="tenant-without-class"),
    ],
)
def test_class_resolution_order(
    headers: dict[str, str], tenant: Tenant | None, req: ParsedRequest, cls: str, source: str
) -> None:
    r = run(headers, tenant, req)
    assert (r.slo.slo_class, r.source) == (cls, source)


def test_each_target_comes_from_the_first_source_that_sets_it() -> None:
    tenant = Tenant("t", slo_class="chat", ttft_ms=500.0, deadline_ms=9000.0)
    r = run({"x-berth-ttft-ms": "250"}, tenant)
    # header ttft, tenant deadline, class itl
    assert (r.slo.ttft_ms, r.slo.itl_ms, r.slo.deadline_ms) == (250.0, 100.0, 9000.0)
    assert r.tenant == "t"


def test_rule_matching_uses_the_client_or_served_model_name() -> None:
    rule = SloRule("ide", model="m-served")
    assert rule_matches(rule, parsed(model="alias"), "m-served")
    assert not rule_matches(SloRule("ide", model="other"), parsed(model="alias"), "m-served")
    assert not rule_matches(SloRule("ide", max_tokens_max=10), parsed(max_tokens=None), "m")
    assert rule_matches(SloRule("ide", prompt_chars_min=50, prompt_chars_max=150), parsed(), "m")
    assert not rule_matches(SloRule("ide", body={"stream": 1}), parsed(body={"stream": True}), "m")


# --------------------------------------------------------------------- header errors
@pytest.mark.parametrize(
    ("headers", "named"),
    [
        pytest.param({"x-berth-ttft-ms": "fast"}, "x-berth-ttft-ms", id="not-a-number"),
        pytest.param({"x-berth-itl-ms": "-5"}, "x-berth-itl-ms", id="negative"),
        pytest.param({"x-berth-deadline-ms": "nan"}, "x-berth-deadline-ms", id="nan"),
        pytest.param({"x-berth-deadline-ms": "inf"}, "x-berth-deadline-ms", id="infinite"),
        pytest.param({"x-berth-ttft-ms": "0"}, "x-berth-ttft-ms", id="zero"),
        pytest.param({"x-berth-ttft-ms": "1e12"}, "x-berth-ttft-ms", id="too-large"),
        pytest.param({"x-berth-priority": "1"}, "x-berth-priority", id="unknown-header"),
        pytest.param({"x-berth-slo-class": ""}, "x-berth-slo-class", id="empty-class"),
        pytest.param({"x-berth-task-sla-ms": "100"}, "x-berth-task-sla-ms", id="sla-without-task"),
        pytest.param({"x-berth-task-id": "a b\x01"}, "x-berth-task-id", id="task-id-not-printable"),
        pytest.param({"x-berth-task-id": "x" * 129}, "x-berth-task-id", id="task-id-too-long"),
    ],
)
def test_malformed_headers_are_400s_naming_the_header(headers: dict[str, str], named: str) -> None:
    with pytest.raises(BerthError) as info:
        parse_slo_headers(headers.items())
    err = info.value
    assert (err.status, err.param, err.code) == (400, named, INVALID_SLO_HEADER)
    assert named in err.message


def test_a_repeated_header_is_a_400() -> None:
    with pytest.raises(BerthError) as info:
        parse_slo_headers([("x-berth-ttft-ms", "1"), ("X-Berth-TTFT-ms", "2")])
    assert info.value.param == "x-berth-ttft-ms"


def test_an_unknown_class_is_a_400_listing_the_known_ones_when_the_policy_rejects() -> None:
    rejecting = dataclasses.replace(POLICY, unknown_class=UnknownClass.REJECT)
    with pytest.raises(BerthError) as info:
        resolve(rejecting, parse_slo_headers([("x-berth-slo-class", "gold")]), None, parsed(), "m", now=1.0)
    err = info.value
    assert (err.status, err.param) == (400, "x-berth-slo-class")
    assert "'gold'" in err.message
    assert "chat, batch, ide, gen" in err.message


def test_an_unknown_class_is_served_in_the_default_class_and_counted() -> None:
    got = run({"x-berth-slo-class": "gold", "x-berth-ttft-ms": "500"})
    assert (got.slo.slo_class, got.source) == ("chat", UNKNOWN_CLASS_SOURCE)
    assert got.slo.ttft_ms == 500.0  # the targets the request sent still count
    assert got.slo.itl_ms == 100.0  # the default class's otherwise
    state = SloAdmission()
    for _ in range(2):
        state.resolve([("x-berth-slo-class", "gold")], None, parsed(), served="m", now=1.0, policy=POLICY)
    state.resolve([("x-berth-slo-class", "ide")], None, parsed(), served="m", now=1.0, policy=POLICY)
    assert state.unknown_classes == {"chat": 2}


def test_other_headers_are_ignored() -> None:
    assert parse_slo_headers([("Authorization", "Bearer x"), ("x-request-id", "r")]) == SloHeaders()


# --------------------------------------------------------------------- tasks
def test_a_task_call_gets_its_share_of_the_task_sla() -> None:
    tasks = TaskClock()
    hdrs = {"x-berth-slo-class": "gen", "x-berth-task-id": "t1", "x-berth-task-sla-ms": "8000"}
    first = run(hdrs, now=100.0, tasks=tasks)
    # steps 3:1 of 8 s: the first call must end by 6 s after the task started; class e2e is looser
    assert first.slo.deadline_ms == pytest.approx(6000.0)
    assert first.slo.ttft_ms is None
    assert first.task is not None
    assert first.task.step == 0
    # the second call comes 5 s later: the task's first token is due 8 s after its start
    second = run(hdrs, now=105.0, tasks=tasks)
    assert second.slo.ttft_ms == pytest.approx(3000.0)
    assert second.slo.deadline_ms == 50000.0  # the class's own target still applies
    assert second.task is not None
    assert second.task.final


def test_a_task_without_an_sla_header_uses_the_class_default() -> None:
    r = run({"x-berth-slo-class": "gen", "x-berth-task-id": "t"}, now=0.0, tasks=TaskClock())
    assert r.slo.deadline_ms == pytest.approx(7500.0)  # 3/4 of 10 s


# --------------------------------------------------------------------- tenants
KEY = "sk-secret-123"


def test_tenants_by_key_and_by_key_hash() -> None:
    digest = hashlib.sha256(b"sk-other").hexdigest().upper()
    tenants = Tenants(
        [
            TenantConfig(name="ide", api_keys=(KEY,), slo_class="ide"),
            TenantConfig(name="batch", api_key_sha256=(digest,)),
        ]
    )
    assert len(tenants) == 2
    found = tenants.lookup(f"Bearer {KEY}")
    assert found is not None
    assert found.name == "ide"
    other = tenants.lookup("bearer  sk-other ")
    assert other is not None
    assert other.name == "batch"
    assert tenants.lookup("Bearer nope") is None
    assert tenants.lookup(f"Basic {KEY}") is None
    assert tenants.lookup(None) is None


def test_keys_never_show_in_reprs() -> None:
    cfg = TenantConfig(name="ide", api_keys=(KEY,))
    t = Tenants([cfg]).lookup(f"Bearer {KEY}")
    assert KEY not in repr(cfg)
    assert KEY not in repr(t)


def test_the_daemon_state_resolves_with_tenants_and_counts_rejections() -> None:
    state = SloAdmission()
    tenants = Tenants([TenantConfig(name="ide", api_keys=(KEY,), slo_class="ide")])
    r = state.resolve(
        [("authorization", f"Bearer {KEY}")],
        tenants.lookup(f"Bearer {KEY}"),
        parsed(),
        served="m",
        now=1.0,
        policy=POLICY,
    )
    assert (r.slo.slo_class, r.tenant) == ("ide", "ide")
    from gateway.core import errors

    err = errors.queue_full("m", 1.0, code="slo_infeasible")
    state.on_finish(
        None, "ide", err, ok=False, arrival=1.0, dispatched_at=None, first_token_at=None, finished_at=1.0
    )
    assert state.rejections_by_class() == {"ide": {"slo_infeasible": 1}}


# --------------------------------------------------------------------- the plain-request fast path
RULELESS = SloPolicy(classes=POLICY.classes, default_class="ide")


def _state_resolve(state: SloAdmission, policy: SloPolicy, headers: dict[str, str]) -> Any:
    return state.resolve(headers.items(), None, parsed(), served="m", now=1.0, policy=policy)


def test_no_berth_header_parses_to_the_shared_empty_headers() -> None:
    assert parse_slo_headers([("Host", "h"), ("X-Request-Id", "r"), ("x-berth", "short")]) is NO_SLO_HEADERS
    assert parse_slo_headers([("X-BERTH-TTFT-MS", "5")]).ttft_ms == 5.0


def test_a_plain_request_under_a_ruleless_policy_reuses_one_answer_per_policy() -> None:
    state = SloAdmission()
    first = _state_resolve(state, RULELESS, {})
    assert (first.slo.slo_class, first.slo.ttft_ms, first.source) == ("ide", 300.0, "default")
    assert _state_resolve(state, RULELESS, {}) is first
    # a reloaded policy (a new object) is resolved afresh
    reloaded = SloPolicy(classes=POLICY.classes, default_class="chat")
    assert _state_resolve(state, reloaded, {}).slo.slo_class == "chat"
    # headers, and policies with rules, take the full path
    assert _state_resolve(state, reloaded, {"x-berth-slo-class": "batch"}).slo.slo_class == "batch"
    with_rules = _state_resolve(state, POLICY, {})
    assert with_rules is not _state_resolve(state, POLICY, {})


# --------------------------------------------------------------------- allowed classes
RESTRICTED = Tenant("ide-team", slo_class="ide", allowed_classes=("ide", "chat"))


@pytest.mark.parametrize(
    ("asked", "want_class", "want_source"),
    [
        pytest.param("chat", "chat", "header", id="allowed-class-kept"),
        pytest.param("batch", "ide", "downgraded", id="outside-downgraded-to-tenant-default"),
        pytest.param("gold", "ide", "downgraded", id="unknown-and-outside-downgraded"),
        pytest.param(None, "ide", "tenant", id="no-header-tenant-default"),
    ],
)
def test_a_class_outside_the_tenants_allowed_classes_is_downgraded(
    asked: str | None, want_class: str, want_source: str
) -> None:
    got = run({} if asked is None else {"x-berth-slo-class": asked}, RESTRICTED)
    assert (got.slo.slo_class, got.source) == (want_class, want_source)


def test_a_class_outside_the_tenants_allowed_classes_is_refused_when_configured() -> None:
    hdrs = parse_slo_headers([("x-berth-slo-class", "batch")])
    with pytest.raises(BerthError) as e:
        resolve(POLICY, hdrs, RESTRICTED, parsed(), "m", now=1.0, reject_disallowed=True)
    err = e.value
    assert (err.status, err.code, err.param) == (403, "slo_class_not_allowed", "x-berth-slo-class")
    # an allowed one still passes
    ok = parse_slo_headers([("x-berth-slo-class", "chat")])
    assert (
        resolve(POLICY, ok, RESTRICTED, parsed(), "m", now=1.0, reject_disallowed=True).slo.slo_class
        == "chat"
    )


def test_without_slo_class_the_first_allowed_class_is_the_tenants_default() -> None:
    t = Tenant("t", allowed_classes=("batch",))
    assert run({}, t).slo.slo_class == "batch"
    assert run({"x-berth-slo-class": "ide"}, t).slo.slo_class == "batch"


def test_downgrades_are_counted_per_tenant() -> None:
    state = SloAdmission()
    state.resolve([("x-berth-slo-class", "batch")], RESTRICTED, parsed(), served="m", now=1.0, policy=POLICY)
    state.resolve([("x-berth-slo-class", "chat")], RESTRICTED, parsed(), served="m", now=1.0, policy=POLICY)
    assert state.downgraded == {"ide-team": 1}


def test_the_api_key_header_is_read_when_there_is_no_bearer_token() -> None:
    tenants = Tenants([TenantConfig(name="ide", api_keys=(KEY,))])
    found = tenants.lookup(None, KEY)
    assert found is not None
    assert found.name == "ide"
    assert tenants.lookup(None, "nope") is None
    # Authorization wins when both are sent
    assert tenants.lookup("Bearer nope", KEY) is None
