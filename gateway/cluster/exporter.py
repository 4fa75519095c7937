"""The cluster's metrics (`berth_cluster_*`), read from the pieces at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.cluster import Cluster


class ClusterCollector:
    def __init__(self, cluster: Cluster) -> None:
        self._c = cluster

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        c = self._c
        link, member, limits = c.link, c.member, c.limits
        yield _gauge(
            "berth_cluster_redis_up", "1 while this replica's Redis calls succeed", 1 if link.up else 0
        )
        rtt = GaugeMetricFamily(
            "berth_cluster_redis_rtt_seconds", "Round trip of this replica's last beat to Redis"
        )
        if link.rtt_s is not None:
            rtt.add_metric([], link.rtt_s)
        yield rtt
        calls = CounterMetricFamily(
            "berth_cluster_redis_calls", "Redis calls made, by result", labels=["result"]
        )
        calls.add_metric(["ok"], link.calls - link.failures)
        calls.add_metric(["failed"], link.failures)
        yield calls
        changes = CounterMetricFamily(
            "berth_cluster_redis_state_changes", "Times the Redis link went up or down", labels=["state"]
        )
        for state, n in sorted(link.transitions.items()):
            changes.add_metric([state], n)
        yield changes
        yield _gauge(
            "berth_cluster_members", "Replicas whose lease is current, as last seen", len(member.members)
        )
        yield _gauge(
            "berth_cluster_leader", "1 while this replica is the leader", 1 if member.is_leader else 0
        )
        token = GaugeMetricFamily("berth_cluster_fencing_token", "The fencing token of the leader seen last")
        if member.token is not None:
            token.add_metric([], member.token)
        yield token
        lc = CounterMetricFamily(
            "berth_cluster_leader_changes", "Times this replica gained or lost the leadership"
        )
        lc.add_metric([], member.leader_changes)
        yield lc
        fb = GaugeMetricFamily(
            "berth_cluster_fallback",
            "1 while a shared piece runs on its fallback (Redis does not answer), by piece",
            labels=["piece"],
        )
        down = 0 if link.up else 1
        for piece in ("limits", "load", "leader", "tasks"):
            fb.add_metric([piece], down)
        yield fb
        adm = CounterMetricFamily(
            "berth_cluster_limit_fallback_decisions",
            "Tenant-limit decisions taken without Redis, by how",
            labels=["how"],
        )
        adm.add_metric(["local"], limits.fallback_admits)
        adm.add_metric(["refused"], limits.refused_down)
        yield adm
        yield _gauge("berth_cluster_pending_releases", "Seat releases waiting to reach Redis", limits.pending)
        sl = CounterMetricFamily(
            "berth_cluster_limit_slice_admissions",
            "Tenant-limit decisions taken on this replica's slice of the limits (no Redis round trip)",
        )
        sl.add_metric([], limits.slices.local)
        yield sl
        sc = CounterMetricFamily(
            "berth_cluster_limit_slice_calls", "Redis calls that topped up or gave back slices of limits"
        )
        sc.add_metric([], limits.slices.calls)
        yield sc


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g
