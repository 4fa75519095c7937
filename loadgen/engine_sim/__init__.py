"""Simulated vLLM/SGLang endpoints: a sans-IO continuous-batching core (`engine.SimEngine`), a thin
aiohttp layer (`server.SimEndpoint`), many endpoints per process (`fleet.SimFleet`) and the
``berth-engine-sim`` command (`cli`)."""

from loadgen.engine_sim.engine import EngineConfig, SimEngine, SimRequest
from loadgen.engine_sim.faults import Faults
from loadgen.engine_sim.fleet import SimFleet, load_fleet_file
from loadgen.engine_sim.latency import LatencyModel
from loadgen.engine_sim.lengths import LengthDist
from loadgen.engine_sim.server import SimEndpoint
from loadgen.engine_sim.spec import EndpointSpec

__all__ = [
    "EndpointSpec",
    "EngineConfig",
    "Faults",
    "LatencyModel",
    "LengthDist",
    "SimEndpoint",
    "SimEngine",
    "SimFleet",
    "SimRequest",
    "load_fleet_file",
]
