"""The admin API: `GET /admin/fleet`, the fleet as berth sees it (what `berth top` draws),
`GET /admin/loop-lag[?after=N&gc_after=M]`, the event loop's recent lag samples
(gateway.core.looplag.RecentLag) and the garbage collector's pauses (gateway.core.gcpauses),
and `GET /admin/cluster`, the replica's view of its cluster (`berth cluster`).

Access: with an admin token configured (`server.admin_token`, or BERTH_ADMIN_TOKEN in the environment,
which wins) a request must send `Authorization: Bearer <token>` (401 otherwise). With none configured
the admin API answers loopback clients only (403 for anyone else). Behind a reverse proxy on the same
machine every client looks local: configure a token there.

The document (JSON; numbers are seconds, tokens or fractions; null where nothing is known yet):
    version, uptime_s, policy, ready, draining
    fail_open            {active, since_s, events}: every ready endpoint's metrics stale
    stale_after_s
    batches[]            the batches being run: id, tenant, endpoint, model, status, total, completed, failed,
                         in_flight, output_tokens, window_left_s
    endpoints[]          id, url, engine, state, class, node, models, group, cap (in force), inflight,
                         running_by_kind {interactive, batch} (what the gateway runs there, by SLO kind),
                         auth {state: ok | failed, failing_routes {route: status}} (failed: the engine
                         answers 401/403 to berth's credentials, a configuration error),
                         gauges {running, waiting, kv_usage, fresh, scrape_age_s, dispatched_since_scrape,
                                 completed_since_scrape, corrected_running},
                         running_context {prompt_tokens, predicted_output_tokens}, kv_capacity_tokens,
                         latency {ttft_s, itl_s: {ewma, p50, p90, p99, n}, tokens_per_s},
                         perf {prefill {k1, c1, mape, n}, decode {k2, c2, c3, mape, n}, kv {h, j, mape, n},
                               throughput {thr1, alpha, beta}},
                         prediction_error {ttft, itl},
                         engine_check {ttft, itl: {ratio, gateway_mean_s, engine_mean_s, disagreements}},
                         prefix {source: approximate | precise, cached_blocks, capacity_blocks,
                                 predicted_hit_rate, engine_hit_rate, event_lag_s, correction} (null: the
                                 index knows nothing of it yet)
    models{name}         queued {class: n}, queued_total, latency (as above), chars_per_token,
                         output_tokens_error, groups {group: {share, endpoints}} (a grouping filter's
                         endpoint groups, e.g. demand-split's; {} without one)
    attainment           {window_s, classes {class: {finished, met, ratio}}}
    telemetry            {pending, dropped, last_refit_age_s}
    slo                  default_class, classes {class: {kind, band, targets, on_infeasible, finished,
                         met, goodput (since start), admission {outcome: n}, rejections {reason: n}}},
                         tasks {active, expired, evicted, max_tasks, idle_expiry_s, step_seconds}
    lifecycle            null without [lifecycle]; else evictor, ready, nodes[] {name, answered, error,
                         devices[] {name, capacity_bytes, used_bytes}}, instances[] {id, model, node, state,
                         devices, memory_bytes, load_s, idle_s, inflight, url, reason}, waiting_loads {model:
                         waited_s}, loads {model: {n, mean_s, last_s}}, evictions {reason: n}, agent_errors
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from typing import Any

import orjson
from aiohttp import web

from gateway import __version__
from gateway.batch.view import batches_document
from gateway.core import errors
from gateway.core.slo import SloKind, SloPolicy
from gateway.core.types import EndpointHealth, EndpointId, ModelName
from gateway.front.http import error_response, request_id
from gateway.front.services import SERVICES, Services
from gateway.sched.snapshot import EndpointView
from gateway.sched.types import PEER_SLO_CLASS
from gateway.telemetry.endpoint_state import EndpointTelemetry
from gateway.telemetry.fleet_state import perf_document
from gateway.telemetry.prefix_index import PrefixIndex

FLEET_PATH = "/admin/fleet"
LOOP_LAG_PATH = "/admin/loop-lag"
SCHED_DECISIONS_PATH = "/admin/sched-decisions"
CLUSTER_PATH = "/admin/cluster"


def is_loopback(remote: str | None) -> bool:
    """Whether a peer address is this machine (IPv4-mapped IPv6 loopback included)."""
    if not remote:
        return False
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def authorize(request: web.Request, token: str) -> None:
    """Raise 401 (token configured, not presented) or 403 (no token, not a loopback client)."""
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            raise errors.unauthorized("the admin API needs 'Authorization: Bearer <admin token>'")
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise errors.unauthorized("invalid admin token")
        return
    if not is_loopback(request.remote):
        raise errors.forbidden(
            "no admin token is configured, so the admin API answers loopback clients only "
            "(set server.admin_token or BERTH_ADMIN_TOKEN)"
        )


def admin_error(e: errors.BerthError, request: web.Request) -> web.Response:
    """The answer to a request `authorize` refused."""
    resp = error_response(e, request_id(request))
    if e.status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="berth-admin"'
    return resp


async def fleet(request: web.Request) -> web.Response:
    s = request.app[SERVICES]
    try:
        authorize(request, s.admin_token)
    except errors.BerthError as e:
        return admin_error(e, request)
    return _no_store_json(fleet_document(s))


async def cluster(request: web.Request) -> web.Response:
    """Cluster mode (`berth cluster`): this replica, the members, the leader and its fencing token, the
    Redis link and round trip, each shared piece's fallback state (gateway.cluster.member). Without
    [cluster]: {"cluster": null}."""
    s = request.app[SERVICES]
    try:
        authorize(request, s.admin_token)
    except errors.BerthError as e:
        return admin_error(e, request)
    doc = None if s.cluster_document is None else s.cluster_document()
    return _no_store_json({"cluster": doc})


async def loop_lag(request: web.Request) -> web.Response:
    """{interval_s, taken, samples: [[taken at (monotonic s), seconds late], ...], gc}: the samples numbered
    above `after` (default 0: all that are kept); `gc` is the collector's pauses
    (`gateway.core.gcpauses.GcPauses.document`), with the kept pauses numbered above `gc_after`."""
    s = request.app[SERVICES]
    try:
        authorize(request, s.admin_token)
        after = _int_query(request, "after")
        gc_after = _int_query(request, "gc_after")
    except errors.BerthError as e:
        return admin_error(e, request)
    doc = s.metrics.loop_lag_recent.document(after)
    doc["gc"] = s.metrics.gc_pauses.document(gc_after)
    return _no_store_json(doc)


async def sched_decisions(request: web.Request) -> web.Response:
    """The scheduler's call times since start (`gateway.core.decisiontime`): {bounds_s, max_s, calls:
    {call: {count, sum_s, max_s, le: [cumulative count per bound, +Inf last]}}, slow_s, slow_taken, slow:
    [[recorded at (monotonic s), call, seconds, CPU seconds], ...]}: the slow calls numbered above
    `slow_after` (default 0: all that are kept)."""
    s = request.app[SERVICES]
    try:
        authorize(request, s.admin_token)
        after = _int_query(request, "slow_after")
    except errors.BerthError as e:
        return admin_error(e, request)
    return _no_store_json(s.metrics.decisions.document(after))


def _no_store_json(doc: object) -> web.Response:
    """An admin document as JSON that no cache keeps (each read is the state now)."""
    return web.Response(
        body=orjson.dumps(doc), content_type="application/json", headers={"Cache-Control": "no-store"}
    )


def _int_query(request: web.Request, name: str) -> int:
    text = request.query.get(name, "0")
    try:
        return int(text)
    except ValueError:
        raise errors.bad_request(f"{name} must be an integer (got {text[:40]!r})", param=name) from None


def fleet_document(s: Services) -> dict[str, Any]:
    """The document as of the telemetry's last refresh (reading it changes nothing)."""
    tel = s.telemetry
    fleet = tel.fleet
    sched = s.scheduler
    snap = sched.snapshot()
    now = snap.now
    queued: dict[str, dict[str, int]] = {str(m): c for m, c in sched.queued_by_class().items()}
    models = sorted({*map(str, sched.models(ready_only=False)), *fleet.models, *queued})
    att = fleet.attainment
    fo = fleet.fail_open
    profile = sched.policy.profile
    groups = {m: profile.groups(ModelName(m)) for m in models}
    group_of = {e: g for by_group in groups.values() for g, (_, eids) in by_group.items() for e in eids}
    return {
        "version": __version__,
        "uptime_s": round(time.time() - s.started_at, 3),
        "policy": s.settings.policy_name,
        "ready": s.ready,
        "draining": s.draining,
        "fail_open": {
            "active": fo.active,
            "since_s": None if fo.since is None else now - fo.since,
            "events": fo.transitions,
        },
        "stale_after_s": sched.limits.stale_after_s,
        "batches": [] if s.batch is None else batches_document(s.batch.progress(), s.batch.wall()),
        "endpoints": [
            {
                **_endpoint(e, fleet.endpoints.get(e.id), now, group_of.get(e.id), s.settings.slo),
                "auth": _auth(s, e.id),
                "prefix": _prefix(tel.prefix, e.id),
            }
            for e in snap.endpoints
        ],
        "models": {
            m: {
                "queued": queued.get(m, {}),
                "queued_total": sum(queued.get(m, {}).values()),
                "latency": None if m not in fleet.models else fleet.models[m].timings.summary(now),
                "chars_per_token": fleet.tokens.chars_per_token(m),
                "output_tokens_error": None if m not in fleet.models else fleet.models[m].output_error.value,
                "groups": {
                    g: {"share": share, "endpoints": [str(e) for e in eids]}
                    for g, (share, eids) in groups[m].items()
                },
            }
            for m in models
        },
        "attainment": {
            "window_s": att.window_s,
            "classes": {
                cls: {"finished": a.finished, "met": a.met, "ratio": a.ratio}
                for cls, a in att.by_class(now).items()
            },
        },
        "telemetry": {
            "pending": tel.pending,
            "dropped": tel.dropped,
            "last_refit_age_s": None if fleet.last_refit_at is None else now - fleet.last_refit_at,
        },
        "slo": s.slo.document(
            s.settings.slo,
            sched.admission.by_class(),
            {cls: (a.finished, a.met) for cls, a in att.totals().items()},
        ),
        "lifecycle": None if s.lifecycle_document is None else s.lifecycle_document(),
    }


def running_by_kind(e: EndpointView, slo: SloPolicy) -> dict[str, int]:
    """The requests the gateway runs on `e`, by the kind of their SLO class (interactive, batch)."""
    out = dict.fromkeys(map(str, SloKind), 0)
    for r in e.running:
        if r.slo_class != PEER_SLO_CLASS:  # (other replicas' requests, cluster mode)
            out[slo.class_of(r.slo_class).kind.value] += 1
    return out


def _prefix(index: PrefixIndex, eid: EndpointId) -> dict[str, Any] | None:
    """The prefix index's view of the endpoint (gateway.telemetry.prefix_index.PrefixStats)."""
    stats = index.stats(eid)
    return None if stats is None else stats.document()


def _auth(s: Services, eid: EndpointId) -> dict[str, Any]:
    """Whether the engine takes berth's credentials: "failed" (with the routes that answered 401/403)
    is a configuration error to fix in gateway.toml, not an engine fault."""
    failing = s.engine_auth.failing(eid)
    return {"state": "failed" if failing else "ok", "failing_routes": failing}


def _endpoint(
    e: EndpointView, t: EndpointTelemetry | None, now: float, group: str | None, slo: SloPolicy
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": e.id,
        "url": e.url,
        "engine": e.engine.value,
        "state": e.health.value,
        "ready": e.health is EndpointHealth.READY,
        "class": e.instance_class.value,
        "node": e.node,
        "models": sorted(e.models),
        "group": group,
        "cap": e.cap,
        "max_batch": e.max_batch,
        "config": e.config,
        "inflight": e.inflight,
        "running_by_kind": running_by_kind(e, slo),
        "gauges": {
            "running": e.engine_running,
            "waiting": e.engine_waiting,
            "kv_usage": e.kv_usage,
            "fresh": e.fresh,
            "scrape_age_s": None if e.scraped_at is None else now - e.scraped_at,
            "dispatched_since_scrape": e.dispatched_since_scrape,
            "completed_since_scrape": e.completed_since_scrape,
            "corrected_running": e.corrected_running,
        },
        "running_context": {
            "prompt_tokens": e.running_prompt_tokens,
            "predicted_output_tokens": e.running_output_tokens,
        },
        "kv_capacity_tokens": None,
        "latency": None,
        "perf": None,
        "prediction_error": None,
        "engine_check": None,
    }
    if t is None:
        return out
    out["kv_capacity_tokens"] = t.kv_capacity_tokens
    out["latency"] = t.timings.summary(now)
    out["perf"] = perf_document(t.coefficients)
    out["prediction_error"] = {q: err.value for q, err in t.prediction_error.items()}
    checks: dict[str, Any] = {}
    for q, check in t.checks.items():
        last = check.last
        checks[q] = {
            "ratio": None if last is None else last.ratio,
            "gateway_mean_s": None if last is None else last.gateway_mean_s,
            "engine_mean_s": None if last is None else last.engine_mean_s,
            "disagreements": t.disagreements[q],
        }
    out["engine_check"] = checks
    return out
