"""The replica directory (cluster mode): where each replica is reached over HTTP, so that a replica can
pass a request for a file or batch held by another one to it (gateway.front.batch_peers).

    P:replicas   hash {replica: its advertised URL ([cluster] advertise_url)}

Each replica writes its own entry and reads the whole hash every `refresh_s`, in one round trip. An
entry is not expired with the replica's lease: a replica that is down keeps its entry, so the ids it
holds are known to be held by a replica that is down (503) rather than unknown (404); `HDEL P:replicas
NAME` retires a replica for good. Which replicas are up is the membership's (the beat's leases).

Redis down: the directory read last stays in use (the peers' URLs rarely change); a replica that never
read it knows no peer until Redis answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import Any

import structlog

from gateway.cluster.link import RedisLink, text
from gateway.cluster.member import ClusterMember

log = structlog.get_logger("berth.cluster")


class ReplicaDirectory:
    """This replica's entry in `P:replicas` and its copy of everyone's (see the module doc)."""

    def __init__(self, link: RedisLink, member: ClusterMember, url: str, *, refresh_s: float) -> None:
        self.link = link
        self.member = member
        self.name = member.name
        self.url = url
        self.refresh_s = refresh_s
        self._key = link.key("replicas")
        self._urls: dict[str, str] = {}
        self.loaded = False  # the hash was read at least once

    def urls(self) -> Mapping[str, str]:
        """Every replica known (up or down) and its URL."""
        return self._urls

    def live(self) -> Collection[str]:
        """The replicas whose lease is current (as of the last beat that answered)."""
        return self.member.members

    async def refresh(self) -> bool:
        """Write this replica's entry and read everyone's; False when Redis did not answer."""

        async def run(r: Any) -> Any:
            async with r.pipeline(transaction=False) as p:
                p.hset(self._key, self.name, self.url)
                p.hgetall(self._key)
                return await p.execute()

        got = await self.link.call("directory", run)
        if got is None:
            return False
        urls = {text(k): text(v) for k, v in got[1].items()}
        if urls != self._urls:
            log.info("cluster_directory", replicas=sorted(urls))
        self._urls = urls
        self.loaded = True
        return True

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_s)
