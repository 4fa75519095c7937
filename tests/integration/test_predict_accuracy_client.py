"""The accuracy benchmark's client against a simulated endpoint over HTTP: what it records (token
receipts, the end of each response, scrapes read with the gateway's parser) is what berth's telemetry
takes in."""

from __future__ import annotations

import aiohttp

from gateway.telemetry.lengths import OutputLengthPredictor
from loadgen.bench.simulator.predict_client import MODEL, Scrape, Stream, fit_phase
from loadgen.bench.simulator.predict_telemetry import BerthTelemetry
from loadgen.engine_sim.fleet import SimFleet
from loadgen.engine_sim.spec import EndpointSpec


async def test_a_small_fit_phase_records_what_berth_needs() -> None:
    spec = EndpointSpec(models=(MODEL,), profile="test-fast", speed=10.0, load_time_s=0.0)
    streams = [Stream(i, prompt=40 + 10 * i, output=12) for i in range(4)]
    scrapes: list[Scrape] = []
    async with SimFleet([spec]) as fleet, aiohttp.ClientSession() as session:
        await fit_phase(
            session,
            fleet.urls[0],
            streams=streams,
            arrivals=[0.0, 0.0, 0.01, 0.02],
            predictor=OutputLengthPredictor(),
            scrapes=scrapes,
            scrape_every_s=0.005,
        )
    for st in streams:
        assert st.ok, st.error
        assert st.tokens == len(st.times) == 12
        assert st.dispatch < st.times[0] <= st.times[-1] <= st.finished
        assert st.predicted is not None
    assert scrapes
    assert all(sc.kv_capacity == 8_192 and 0.0 <= sc.kv_usage <= 1.0 for sc in scrapes)
    berth = BerthTelemetry()
    berth.add_phase(streams, scrapes, speed=10.0)
    assert berth.endpoint.timings.ttft.n == 4  # every stream went in as measured: streamed, ok, first try
