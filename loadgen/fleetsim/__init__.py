"""The offline fleet simulator: berth's real scheduler core, admission, SLO resolution, task clocks and
telemetry, driven on a virtual clock in front of sans-IO engine models (`SimEngine`), one process, no
sockets and no sleeping. `simulate(SimOptions)` returns the same report as `berth-loadgen run`.
"""

from loadgen.fleetsim.options import SimOptions
from loadgen.fleetsim.sim import simulate

__all__ = ["SimOptions", "simulate"]
