"""The JSON contract of `berth-agent`: what each command prints on stdout (one object per invocation).

A command that succeeds prints its report and exits 0; one that fails prints `ErrorReport`
(`{"error": {"code", "message", ...}}`) and exits non-zero (2: bad arguments or configuration, 1: anything
else). Memory is in bytes, times are Unix seconds (`*_at`) or durations in seconds (`*_s`). The gateway's
agent client decodes these Structs with `msgspec.json.decode(out, type=...)`; fields are only ever added.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, Literal

import msgspec


class InstanceState(enum.StrEnum):
    """starting -> ready -> stopping -> stopped; failed from any of the first three."""

    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


#: States whose engine may hold device memory (they count in the ledger).
RESIDENT_STATES: frozenset[InstanceState] = frozenset(
    {InstanceState.STARTING, InstanceState.READY, InstanceState.STOPPING}
)


class ErrorCode(enum.StrEnum):
    BAD_ARGUMENTS = "bad_arguments"  # exit 2
    CONFIG = "config_error"  # exit 2
    UNKNOWN_MODEL = "unknown_model"
    UNKNOWN_INSTANCE = "unknown_instance"
    UNKNOWN_CONFIG = "unknown_config"  # --config names no configuration of the model
    DUPLICATE_INSTANCE = "duplicate_instance"  # --id names a resident instance
    DOES_NOT_FIT = "insufficient_memory"  # `devices` says by how much, per device
    DEVICE_BUSY = "device_busy"  # another load holds the devices it could use (`loading`)
    TOO_FEW_DEVICES = "too_few_devices"  # the model needs more devices than the node has
    MEMORY_NOT_RELEASED = "memory_not_released"  # NVML did not see a stopped engine's memory free in time
    NO_PORT = "no_free_port"
    LAUNCH_FAILED = "launch_failed"  # the backend could not start the engine
    EARLY_EXIT = "engine_exited"  # the engine exited before its health route answered
    LOAD_TIMEOUT = "load_timeout"  # health did not answer within the model's load_timeout_s
    STALLED = "load_stalled"  # no CPU used by the engine for stall_timeout_s while loading
    LOAD_CANCELLED = "load_cancelled"  # a `stop` ended the instance during its load
    STOP_FAILED = "stop_failed"  # processes of the instance survived SIGKILL
    BACKEND = "backend_error"  # systemd-run / systemctl / journalctl failed
    # --fencing-token below the highest this node has seen: a former gateway leader's command (refused,
    # nothing done).
    STALE_FENCING_TOKEN = "stale_fencing_token"


class DeviceReport(msgspec.Struct, frozen=True, kw_only=True):
    """One device in the memory ledger. free = total - headroom - reserved (never below 0)."""

    name: str
    index: int
    source: Literal["nvml", "config"]  # where total_bytes comes from
    total_bytes: int
    headroom_bytes: int
    reserved_bytes: int  # per instance: what it was admitted with, or NVML's measure when more
    free_bytes: int
    measured_used_bytes: int | None  # NVML's used memory on the device (everything, not just ours)
    loading: str | None  # the instance loading on it (one load per device at a time)
    settled_at: float | None  # after a stop without NVML: no load here before this time
    instances: list[str]


class NodeReport(msgspec.Struct, frozen=True, kw_only=True):
    """`berth-agent node`."""

    node: str  # hostname
    backend: Literal["process", "systemd"]
    nvml: bool  # NVML answered (measured memory available)
    total_bytes: int
    reserved_bytes: int
    free_bytes: int
    devices: list[DeviceReport]
    models: list[str]  # the registry's model names


class InstanceReport(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    engine: str
    state: InstanceState
    url: str  # http://HOST:PORT of the engine
    port: int
    devices: list[str]
    device_indices: list[int]  # what CUDA_VISIBLE_DEVICES says
    memory_bytes: int  # per device, as admitted
    measured_bytes: int | None  # NVML's measure for the instance's processes (per device, the largest)
    started_at: float  # record written (Unix seconds)
    ready_at: float | None
    load_s: float | None  # launch -> health answered
    pid: int | None  # process backend: the process group leader; systemd: the unit's main pid
    unit: str | None  # systemd backend
    healthy: bool | None  # the last health probe (None: not probed in this invocation)
    reason: str | None  # why it failed or stopped
    stopped_at: float | None
    config: str | None = None  # its instance configuration ([[models.configs]]); None: the model has none
    max_batch: int | None = None  # the configuration's max batch


class ListReport(msgspec.Struct, frozen=True, kw_only=True):
    """`berth-agent list`: every instance record, resident ones first."""

    node: str
    instances: list[InstanceReport]


class Victim(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    state: InstanceState
    devices: list[str]
    frees_bytes: int  # per device it holds
    idle: bool  # False while it is starting or stopping


class DeviceFit(msgspec.Struct, frozen=True, kw_only=True):
    """Admission numbers of one device for one model."""

    name: str
    capacity_bytes: int  # total - headroom
    reserved_bytes: int
    required_bytes: int
    free_bytes: int
    fits: bool
    loading: str | None


class PlanReport(msgspec.Struct, frozen=True, kw_only=True):
    """`berth-agent plan MODEL`: does it fit now, where, and if not, what would have to go."""

    model: str
    fits: bool
    devices: list[str]  # where it would load now ([] when it does not fit)
    required_bytes: int  # per device
    devices_needed: int
    per_device: list[DeviceFit]
    evict: list[str] | None  # the fewest instances (then fewest bytes) whose stop makes it fit
    evict_devices: list[str]  # where it would load after that eviction
    victims: list[Victim]  # every resident instance and what its stop would free
    reason: str  # one line for logs
    config: str | None = None  # the instance configuration planned (None: the model has none)


class StopReport(msgspec.Struct, frozen=True, kw_only=True):
    """`berth-agent stop ID`."""

    id: str
    state: InstanceState  # stopped
    stopped_at: float
    stop_s: float
    killed: bool  # SIGKILL was needed after the drain timeout
    was: InstanceState  # its state before the stop


class StartReport(msgspec.Struct, frozen=True, kw_only=True):
    """`berth-agent start MODEL`: the ready instance, with the measured load time."""

    instance: InstanceReport
    load_s: float
    evicted: list[StopReport]


class LogsReport(msgspec.Struct, frozen=True, kw_only=True):
    """`berth-agent logs ID`: the last lines of the engine's output."""

    id: str
    source: str  # the log file, or journal:UNIT
    lines: list[str]


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    code: ErrorCode
    message: str
    model: str | None = None
    instance: str | None = None
    devices: list[DeviceFit] | None = None  # insufficient_memory: the numbers, per candidate device
    loading: str | None = None  # device_busy: the instance loading
    log_tail: list[str] | None = None  # a failed start: the engine's last output lines


class ErrorReport(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorBody


class AgentError(Exception):
    """A command that fails: rendered as ErrorReport by the CLI."""

    def __init__(self, body: ErrorBody) -> None:
        super().__init__(body.message)
        self.body = body

    @classmethod
    def of(
        cls,
        code: ErrorCode,
        message: str,
        *,
        model: str | None = None,
        instance: str | None = None,
        devices: list[DeviceFit] | None = None,
        loading: str | None = None,
        log_tail: list[str] | None = None,
    ) -> AgentError:
        return cls(
            ErrorBody(
                code=code,
                message=message,
                model=model,
                instance=instance,
                devices=devices,
                loading=loading,
                log_tail=log_tail,
            )
        )

    @property
    def exit_status(self) -> int:
        return 2 if self.body.code in (ErrorCode.BAD_ARGUMENTS, ErrorCode.CONFIG) else 1


Report = NodeReport | ListReport | PlanReport | StartReport | StopReport | LogsReport

#: The report each command prints on success.
REPORTS: Final[Mapping[str, type[Report]]] = {
    "node": NodeReport,
    "list": ListReport,
    "plan": PlanReport,
    "start": StartReport,
    "stop": StopReport,
    "logs": LogsReport,
}


def decode_output(command: str, stdout: bytes) -> Report:
    """What `berth-agent COMMAND` printed, for its caller (the gateway's agent client).

    Returns the command's report; raises AgentError when the agent printed an error, and
    msgspec.DecodeError when stdout is neither (e.g. ssh failed before the agent ran).
    """
    try:
        return msgspec.json.decode(stdout, type=REPORTS[command])
    except msgspec.DecodeError:
        error = msgspec.json.decode(stdout, type=ErrorReport)  # raises DecodeError when it is not one either
    raise AgentError(error.error)
