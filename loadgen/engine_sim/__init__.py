"""Simulated vLLM/SGLang endpoints: a sans-IO continuous-batching core (`engine.SimEngine`), a thin
aiohttp layer (`server.SimEndpoint`), many endpoints per process (`fleet.SimFleet`) and the
``berth-engine-sim`` command (`cli`). Import from the modules themselves: the package imports none of
them, so no module of it imports its own package's others through it."""
