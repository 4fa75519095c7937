"""Which endpoints best fit (`gateway.sched.plugins.placement.best_fit`) tries first for a request with
part of its prompt cached."""

from __future__ import annotations

from gateway.sched.predict import EndpointLoad
from gateway.sched.request import SchedRequest


def holders_first(req: SchedRequest, order: list[EndpointLoad]) -> list[EndpointLoad]:
    """`order` with the endpoints holding part of the request's prompt in their prefix cache moved to
    the front, earliest predicted first token first, when their first token comes before the one on the
    endpoint the order would try first: waiting there costs less than the prefill the cache saves
    (both in the same prediction, `EndpointLoad.predict`). Without a cached prefix, `order` as it is."""
    if not order:
        return order
    head = order[0].predict(req).ttft_s
    ahead = []
    for load in order:
        if req.cached.get_tokens(load.view.id) > 0:
            ttft = load.predict(req).ttft_s
            if ttft < head:
                ahead.append((ttft, str(load.view.id), load))
    if not ahead:
        return order
    ahead.sort(key=lambda t: (t[0], t[1]))
    first = [t[2] for t in ahead]
    moved = {id(x) for x in first}
    return first + [x for x in order if id(x) not in moved]
