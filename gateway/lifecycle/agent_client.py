"""Running `berth-agent` commands: one subprocess per call, through the node's command prefix (`ssh gpu-07
berth-agent -c ...`, or a local `berth-agent`), one JSON object read from its stdout (the agent's contract,
`gateway.agent.contract`), a timeout per call.

A call that fails raises `AgentCallError` with the agent's error code and message when it printed one
(`insufficient_memory`, `engine_exited` with the engine's last log lines, ...), or `timeout`,
`agent_exited` (no JSON error) or `bad_json`. A call that times out or is cancelled kills the agent's
process group (the engines it started run detached and outlive it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

from gateway.agent.contract import ErrorBody, ErrorReport, ListReport, NodeReport, StartReport, StopReport

T = TypeVar("T")

#: Characters of the agent's stderr kept in an error message.
STDERR_TAIL = 400


class AgentCallError(Exception):
    def __init__(
        self, code: str, message: str, *, node: str, command: str, body: ErrorBody | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.node = node
        self.command = command
        self.body = body  # the agent's error as it printed it (e.g. insufficient_memory's per-device numbers)


class AgentClient:
    """The agent of one node."""

    def __init__(
        self,
        node: str,
        prefix: Sequence[str],
        *,
        timeout_s: float,
        fencing: Callable[[], int | None] | None = None,
    ) -> None:
        """`fencing`: the fencing token of this gateway's leadership now (cluster mode; None: not the
        leader, or no cluster), sent with every command as `--fencing-token N`."""
        self.node = node
        self.prefix = tuple(prefix)
        self.timeout_s = timeout_s
        self.fencing = fencing

    async def node_report(self) -> NodeReport:
        return await self.call(["node"], NodeReport)

    async def list_instances(self) -> ListReport:
        return await self.call(["list"], ListReport)

    async def start(
        self, model: str, instance_id: str, *, timeout_s: float, config: str | None = None
    ) -> StartReport:
        """Start an instance of `model` (of instance configuration `config`; None: the model's default)."""
        args = ["start", model, "--id", instance_id]
        if config is not None:
            args += ["--config", config]
        return await self.call(args, StartReport, timeout_s=timeout_s)

    async def stop(self, instance_id: str, *, drain_timeout_s: float) -> StopReport:
        # The gateway drained it already; the agent's drain timeout is its SIGTERM -> SIGKILL grace.
        return await self.call(
            ["stop", instance_id, "--drain-timeout", f"{drain_timeout_s:g}"],
            StopReport,
            timeout_s=self.timeout_s + drain_timeout_s,
        )

    async def call(self, args: Sequence[str], typ: type[T], *, timeout_s: float | None = None) -> T:
        command = args[0]
        limit = self.timeout_s if timeout_s is None else timeout_s
        token = None if self.fencing is None else self.fencing()
        if token is not None:
            args = [*args, "--fencing-token", str(token)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.prefix,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
        except OSError as e:
            raise AgentCallError("agent_not_started", str(e), node=self.node, command=command) from None
        try:
            async with asyncio.timeout(limit):
                out, err = await proc.communicate()
        except TimeoutError:
            await _kill(proc)
            raise AgentCallError(
                "timeout", f"no answer within {limit:g}s", node=self.node, command=command
            ) from None
        except asyncio.CancelledError:
            await _kill(proc)
            raise
        if proc.returncode != 0:
            try:
                body = msgspec.json.decode(out, type=ErrorReport).error
            except msgspec.DecodeError:
                tail = err.decode(errors="replace").strip()[-STDERR_TAIL:]
                raise AgentCallError(
                    "agent_exited", f"exit status {proc.returncode}: {tail}", node=self.node, command=command
                ) from None
            message = body.message
            if body.log_tail:
                message += " | " + " | ".join(body.log_tail[-5:])
            raise AgentCallError(str(body.code), message, node=self.node, command=command, body=body)
        try:
            return msgspec.json.decode(out, type=typ)
        except msgspec.DecodeError as e:
            raise AgentCallError("bad_json", str(e), node=self.node, command=command) from None


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()
