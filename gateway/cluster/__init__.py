"""Cluster mode: several berth replicas as one gateway, sharing what must be shared through Redis.

Built by the composition root only when gateway.toml has [cluster]; without it nothing here exists and
nothing is contacted. `Cluster` holds the pieces: the Redis link (`link`), the replica's membership,
load publication and the fenced leader lease (`member`), the shared tenant limits (`limits`, with
`slices` of large limits spent without a round trip; their Lua pieces in `lua`) and task clocks
(`tasks`), and their metrics (`exporter`). docs/cluster.md states each piece's consistency and
its fallback while Redis does not answer.
"""

from __future__ import annotations

from typing import Any

from gateway.cluster.limits import SharedLimits
from gateway.cluster.link import RedisLink
from gateway.cluster.member import ClusterMember
from gateway.cluster.tasks import SharedTasks
from gateway.config.cluster import ClusterSetup
from gateway.core.tasks import TaskSupervisor


class Cluster:
    def __init__(
        self, setup: ClusterSetup, *, retry_after_s: float = 1.0, link: RedisLink | None = None
    ) -> None:
        self.setup = setup
        self.link = link or RedisLink(setup)
        self.limits = SharedLimits(
            self.link,
            setup.name,
            on_down=setup.config.on_redis_down,
            retry_after_s=retry_after_s,
            slice_share=setup.config.slice_share,
        )
        self.tasks = SharedTasks(self.link)
        self.member = ClusterMember(setup, self.link, limits=self.limits)

    def start(self, supervisor: TaskSupervisor) -> None:
        supervisor.spawn("cluster-beat", self.member.run)
        supervisor.spawn("cluster-releases", self.limits.flush_forever)
        supervisor.spawn("cluster-task-steps", self.tasks.flush_forever)

    async def close(self) -> None:
        await self.link.close()

    def document(self) -> dict[str, Any]:
        doc = self.member.document()
        doc["tasks"] = {"local_calls": self.tasks.local_calls}
        return doc


__all__ = ["Cluster", "ClusterMember", "RedisLink", "SharedLimits", "SharedTasks"]
