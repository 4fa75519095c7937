"""The request context keeps a refused request's error without its traceback: a kept traceback would hold
the frames the error passed through, and so the context and everything those frames held, in a cycle
that only the cyclic collector frees (a stream of refused requests then makes its young pass long)."""

from __future__ import annotations

import gc
import weakref

from gateway.core import errors
from gateway.core.errors import BerthError
from gateway.core.types import ApiKind
from gateway.dispatch.context import RequestContext


class Marker:
    """Something a failing frame holds, as a handler holds the request and the parsed body."""


def _refuse(kept: list[RequestContext]) -> weakref.ref[Marker]:
    marker = Marker()
    ctx = RequestContext(id="r1", api=ApiKind.CHAT, arrival=0.0)
    try:
        raise errors.model_not_found("nope", ["tiny"])
    except BerthError as e:
        ctx.fail(e)
    kept.append(ctx)  # the context outlives the handler: the finish phase reads it
    return weakref.ref(marker)


def test_a_failed_context_keeps_no_frame_alive() -> None:
    kept: list[RequestContext] = []
    gc.disable()
    try:
        ref = _refuse(kept)
        assert ref() is None  # freed by reference counting as the handler returned: no cycle
    finally:
        gc.enable()
    ctx = kept[0]
    assert ctx.error is not None
    assert ctx.error.__traceback__ is None
    assert (ctx.status, ctx.outcome) == (404, ctx.error.outcome)
    assert ctx.error.code == "model_not_found"
