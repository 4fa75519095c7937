"""Which endpoint made each Responses API answer, and for which tenant.

vLLM keeps a response (for `GET /v1/responses/{id}`, its cancel, and a later request's
`previous_response_id`) in the memory of the engine that made it, so those calls must go back there.
The map holds the most recent `RESPONSE_IDS` ids (least recently used out first): an entry is about
250 bytes, so the map stays under ~16 MB. An id it no longer holds, or whose endpoint has left the
fleet, is unknown to berth and asked of any endpoint (whose 404 the client gets).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from gateway.core.types import EndpointId

RESPONSE_IDS: Final = 65_536


@dataclass(frozen=True, slots=True)
class ResponseOwner:
    endpoint: EndpointId
    tenant: str


class ResponseIds:
    """A bounded map response id -> owner (LRU)."""

    __slots__ = ("_ids", "size")

    def __init__(self, size: int = RESPONSE_IDS) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.size = size
        self._ids: OrderedDict[str, ResponseOwner] = OrderedDict()

    def record(self, response_id: str, endpoint: EndpointId, tenant: str) -> None:
        ids = self._ids
        ids[response_id] = ResponseOwner(endpoint, tenant)
        ids.move_to_end(response_id)
        if len(ids) > self.size:
            ids.popitem(last=False)

    def get(self, response_id: str) -> ResponseOwner | None:
        owner = self._ids.get(response_id)
        if owner is not None:
            self._ids.move_to_end(response_id)
        return owner

    def forget(self, response_id: str) -> None:
        self._ids.pop(response_id, None)

    def __len__(self) -> int:
        return len(self._ids)
