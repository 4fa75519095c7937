"""Files and batches in cluster mode: any replica answers for any file or batch.

A file or batch lives on the replica that made it (its batch directory, its runner), and its id says
which one: `file-` or `batch_`, the replica's tag (`gateway.batch.model.replica_tag`), random digits. A
replica that gets a request for an id it does not hold passes the request to the holder over HTTP, with
the caller's key, and answers the holder's response unchanged (its status, its body: the holder decides
what the tenant may see, so another tenant still gets 404). The holder's address is in the cluster's
replica directory (`gateway.cluster.directory`, reached through `ReplicaView`); whether it is up is the
membership's. A holder that is down, or does not answer, gives a 503 `replica_unavailable` at once
(never a 404: the batch is not lost, it resumes when its replica starts again). A request passed on
carries `x-berth-forwarded-by` and is answered where it lands: no request travels twice.

Lists are merged: `gateway.front.batch_lists`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

import aiohttp
import structlog
from aiohttp import hdrs, web

from gateway.batch.model import replica_tag, tag_of
from gateway.core import errors
from gateway.core.errors import BerthError

log = structlog.get_logger("berth.batch")

#: A request one replica passes to another: the receiver answers it from its own store.
FORWARDED_BY: Final = "x-berth-forwarded-by"
#: Time for a peer to connect, and at most between two reads of its answer.
ANSWER_TIMEOUT_S: Final = 10.0
_CHUNK: Final = 256 * 1024
#: The request headers passed on: the caller's key (either header gateway.front.auth reads: the holder
#: authenticates it) and what the body is.
_PASSED: Final = (hdrs.AUTHORIZATION, "api-key", hdrs.CONTENT_TYPE, hdrs.X_REQUEST_ID)
#: The response headers answered back with the holder's status and body.
_ANSWERED: Final = (hdrs.CONTENT_TYPE, hdrs.CONTENT_DISPOSITION, hdrs.RETRY_AFTER, hdrs.WWW_AUTHENTICATE)


class ReplicaView(Protocol):
    """What the front needs of the cluster: its replicas' addresses and which are up."""

    @property
    def name(self) -> str: ...

    @property
    def loaded(self) -> bool:
        """The addresses were read at least once."""

    def urls(self) -> Mapping[str, str]:
        """Every replica known (up or down) and its URL."""

    def live(self) -> Collection[str]: ...


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    url: str


def replica_unavailable(object_id: str, replica: str | None, why: str) -> BerthError:
    held = f"replica {replica}" if replica else "another replica"
    return BerthError(
        status=503,
        message=f"{object_id[:100]} is held by {held}, which {why}; try again when it is back",
        type="service_unavailable_error",
        code="replica_unavailable",
        outcome="unavailable",
        source=errors.ErrorSource.GATEWAY,
        retryable=True,
        retry_after_s=5.0,
    )


class BatchPeers:
    """This replica's view of who holds which file or batch, and the forwarding (see the module doc)."""

    def __init__(self, view: ReplicaView, session: Callable[[], aiohttp.ClientSession]) -> None:
        self.view = view
        self.name = view.name
        self.tag = replica_tag(view.name)
        self.session = session
        self._seen: Mapping[str, str] | None = None
        self._names: dict[str, str] = {}  # tag -> replica

    def _by_tag(self) -> dict[str, str]:
        urls = self.view.urls()
        if urls is not self._seen:
            self._seen = urls
            self._names = {replica_tag(n): n for n in urls}
        return self._names

    def owner(self, object_id: str) -> Peer | None:
        """The peer that holds `object_id`; None when this replica answers it (its own, an id without a
        tag, or one no replica made: the local store then says 404). Raises a 503 when its holder is down
        or the directory was never read (Redis has not answered since this replica started)."""
        tag = tag_of(object_id)
        if not tag or tag == self.tag:
            return None
        name = self._by_tag().get(tag)
        if name is None:
            if not self.view.loaded:
                raise replica_unavailable(
                    object_id, None, "this replica cannot look up (Redis does not answer)"
                )
            return None
        if name not in self.view.live():
            raise replica_unavailable(object_id, name, "is down")
        return Peer(name, self.view.urls()[name])

    def peers(self) -> tuple[list[Peer], list[str]]:
        """The other replicas that are up (with an address), and the names of those that are not."""
        live = set(self.view.live())
        up: list[Peer] = []
        down: list[str] = []
        for name, url in sorted(self.view.urls().items()):
            if name == self.name:
                continue
            if name in live:
                up.append(Peer(name, url))
            else:
                down.append(name)
        return up, down

    def headers(self, request: web.Request) -> dict[str, str]:
        out = {FORWARDED_BY: self.name}
        for h in _PASSED:
            v = request.headers.get(h)
            if v is not None:
                out[h] = v
        return out

    async def forward(
        self, request: web.Request, peer: Peer, object_id: str, body: bytes | None
    ) -> web.StreamResponse:
        """Pass `request` to `peer` and answer its response unchanged (503 when it does not answer)."""
        try:
            up = await self.session().request(
                request.method,
                peer.url + request.path_qs,
                data=body,
                headers=self.headers(request),
                timeout=aiohttp.ClientTimeout(sock_connect=ANSWER_TIMEOUT_S, sock_read=ANSWER_TIMEOUT_S),
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("batch_forward_failed", replica=peer.name, id=object_id, error=type(e).__name__)
            raise replica_unavailable(object_id, peer.name, "does not answer") from None
        try:
            resp = web.StreamResponse(
                status=up.status, headers={h: up.headers[h] for h in _ANSWERED if h in up.headers}
            )
            if up.content_length is not None:
                resp.content_length = up.content_length
            await resp.prepare(request)
            try:
                async for chunk in up.content.iter_chunked(_CHUNK):
                    await resp.write(chunk)
            except (aiohttp.ClientError, TimeoutError) as e:
                # Too late for a status: cut the connection so the client sees a short body.
                log.warning("batch_forward_cut", replica=peer.name, id=object_id, error=type(e).__name__)
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
            return resp
        finally:
            up.release()
