"""The simulator's front marks every request resumable with `resumable`, which builds the same request as
`dataclasses.replace(sreq, resumable=True)`."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.types import SLO, ApiKind, EndpointId, ModelName, RequestId
from gateway.sched.request import SchedRequest
from loadgen.fleetsim.gateway import resumable


@settings(max_examples=100, deadline=None)
@given(
    st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 500)),
    st.one_of(st.none(), st.floats(1.0, 1e4)),
    st.one_of(st.none(), st.sampled_from(["e1", "e2"])),
    st.one_of(st.none(), st.integers(1, 4096)),
)
def test_resumable_is_replace(
    state: tuple[bool, int, int], predicted: float | None, pinned: str | None, cap: int | None
) -> None:
    already, preemptions, produced = state
    sreq = SchedRequest(
        id=RequestId("r"),
        model=ModelName("m"),
        api=ApiKind.CHAT,
        arrival=1.5,
        slo=SLO("chat", ttft_ms=500.0),
        prompt_tokens=16,
        max_tokens=cap,
        stream=True,
        task_id="t",
        predicted_output_tokens=predicted,
        resumable=already,
        preemptions=preemptions,
        produced_tokens=produced,
        pinned=None if pinned is None else EndpointId(pinned),
    )
    got = resumable(sreq)
    want = dataclasses.replace(sreq, resumable=True)
    assert got == want
    assert [getattr(got, f.name) for f in dataclasses.fields(got)] == [
        getattr(want, f.name) for f in dataclasses.fields(want)
    ]
