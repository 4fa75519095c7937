"""Task clocks shared by the replicas: a task's start, type, SLA and calls in one Redis hash, so a task's
calls may land on any replica and still share one clock (gateway.admission.tasks).

    P:task:KEY   hash {start: Redis time, type, sla (seconds, "" for none), calls}, PX idle_expiry_s

`call` claims the next step in one script (the first call of a task writes its start, type and SLA: the
first writer wins) and answers how long ago the task started by Redis's clock, which the replica turns
into a start on its own clock. A call that never ran gives its step back (`abandon`, sent in the
background). Each replica's learned step durations (`learn_allotments`) stay its own. While Redis does
not answer, the replica's own task clock decides (a task whose calls then land on different replicas
has one clock per replica until Redis is back).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from gateway.cluster.link import RedisLink, text

CALL_LUA: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'start', tostring(now), 'type', ARGV[1], 'sla', ARGV[2], 'calls', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'0', ARGV[1], ARGV[2], 0}
end
local calls = redis.call('HINCRBY', KEYS[1], 'calls', 1)
local v = redis.call('HMGET', KEYS[1], 'start', 'type', 'sla')
local sla = v[3]
if ((not sla) or sla == '') and ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'sla', ARGV[2])
  sla = ARGV[2]
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {tostring(now - tonumber(v[1])), v[2], sla or '', calls - 1}
"""

ABANDON_LUA: Final = """
for i = 1, #KEYS do
  if tonumber(redis.call('HGET', KEYS[i], 'calls') or '-1') == tonumber(ARGV[i]) + 1 then
    redis.call('HINCRBY', KEYS[i], 'calls', -1)
  end
end
return #KEYS
"""


class SharedTasks:
    """gateway.admission.state.SharedTaskClock over Redis (see the module doc)."""

    def __init__(self, link: RedisLink) -> None:
        self.link = link
        self._call = link.script(CALL_LUA)
        self._abandon = link.script(ABANDON_LUA)
        self._pending: list[tuple[str, int]] = []
        self._wake = asyncio.Event()
        self.local_calls = 0  # calls decided by the local clock while Redis did not answer

    async def call(
        self, key: str, task_type: str, sla_s: float | None, idle_expiry_s: float
    ) -> tuple[float, str, float | None, int] | None:
        """(seconds since the task started, its type, its SLA, this call's step); None: Redis is down."""
        keys = [self.link.key("task", key)]
        args: list[Any] = [task_type, "" if sla_s is None else repr(sla_s), max(1, int(idle_expiry_s * 1000))]
        got = await self.link.call("task", lambda r: self._call(keys=keys, args=args, client=r))
        if got is None:
            self.local_calls += 1
            return None
        sla = text(got[2])
        return float(text(got[0])), text(got[1]), float(sla) if sla else None, int(got[3])

    def abandon(self, key: str, step: int) -> None:
        self._pending.append((key, step))
        self._wake.set()

    async def flush_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()
            if self._pending:
                self._wake.set()

    async def flush(self) -> None:
        """Send up to 256 steps given back. One that Redis did not take (down) is dropped: it only makes
        the task's next call a step later."""
        batch, self._pending = self._pending[:256], self._pending[256:]
        if not batch:
            return
        keys = [self.link.key("task", k) for k, _ in batch]
        args = [step for _, step in batch]
        await self.link.call("task_abandon", lambda r: self._abandon(keys=keys, args=args, client=r))
