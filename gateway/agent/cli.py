"""`berth-agent [-c agent.toml] node | list | plan MODEL [--config NAME] | start MODEL [--config NAME]
[--id ID] [--evict ID ...] | stop ID [--drain-timeout S] | logs ID [--tail N]`: one JSON object on stdout
per invocation.
(`start` also takes `--drain-timeout S` for its victims.)

Every command takes `--fencing-token N` (before or after the command's own arguments): the token of the
gateway leader that sends it (cluster mode). The node remembers the highest token it has seen
(STATE_DIR/fence) and refuses a lower one with `stale_fencing_token` before doing anything, so a former
leader (paused, partitioned) cannot act after a new one took over. Without it a command runs as always.

Exit status 0 with the command's report (`gateway.agent.contract`), or non-zero with
`{"error": {"code", "message", ...}}`: 2 for bad arguments or configuration, 1 for everything else.
The configuration is `-c FILE`, else $BERTH_AGENT_CONFIG, else /etc/berth/agent.toml.

`--from-ssh` is for an ssh forced command (`command="berth-agent -c /etc/berth/agent.toml --from-ssh"` in
authorized_keys): the command comes from $SSH_ORIGINAL_COMMAND, whose own `berth-agent` and `-c FILE`
are dropped, so the key can run agent commands and nothing else, with the node's configuration.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, NoReturn

import msgspec

from gateway.agent.backends import Backend
from gateway.agent.backends.process import ProcessBackend
from gateway.agent.backends.systemd import SystemdBackend
from gateway.agent.config import AgentConfig, load_agent_config
from gateway.agent.contract import AgentError, ErrorCode, ErrorReport, Report
from gateway.agent.inventory import PynvmlProbe
from gateway.agent.node import Agent
from gateway.agent.state import StaleFencingToken, StateDir
from gateway.core.errors import ConfigError

CONFIG_ENV: Final = "BERTH_AGENT_CONFIG"
DEFAULT_CONFIG: Final = "/etc/berth/agent.toml"


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in the JSON contract instead of printing usage text."""

    def error(self, message: str) -> NoReturn:
        raise AgentError.of(ErrorCode.BAD_ARGUMENTS, f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="berth-agent", description="berth's node agent: starts and stops engines under memory limits"
    )
    p.add_argument(
        "-c", "--config", type=Path, help=f"agent.toml (default ${CONFIG_ENV} or {DEFAULT_CONFIG})"
    )
    p.add_argument(
        "--from-ssh",
        action="store_true",
        help="take the command from $SSH_ORIGINAL_COMMAND (ssh forced command)",
    )
    fence_help = (
        "the gateway leader's fencing token: refused (stale_fencing_token, nothing done) when below the "
        "highest this node has seen"
    )
    p.add_argument("--fencing-token", type=_token, default=None, metavar="N", help=fence_help)
    # Accepted after the command too (`start MODEL --fencing-token N`); SUPPRESS keeps the one given first.
    common = _Parser(add_help=False)
    common.add_argument(
        "--fencing-token", type=_token, default=argparse.SUPPRESS, metavar="N", help=fence_help
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("node", help="devices and the memory ledger", parents=[common])
    sub.add_parser("list", help="instances with state, url, devices, memory", parents=[common])
    plan = sub.add_parser(
        "plan", help="does MODEL fit now, where, and what would have to go", parents=[common]
    )
    plan.add_argument("model")
    plan.add_argument(
        "--config",
        dest="instance_config",
        metavar="NAME",
        help="instance configuration (default: the model's)",
    )
    start = sub.add_parser(
        "start", help="start an instance of MODEL and wait for its health", parents=[common]
    )
    start.add_argument("model")
    start.add_argument("--id", dest="instance_id", help="instance id (default MODEL-PORT)")
    start.add_argument(
        "--config",
        dest="instance_config",
        metavar="NAME",
        help="instance configuration (default: the model's)",
    )
    start.add_argument("--evict", nargs="+", default=[], metavar="ID", help="stop these instances first")
    start.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="S",
        help="SIGTERM -> SIGKILL seconds for --evict",
    )
    stop = sub.add_parser("stop", help="stop instance ID and every process of it", parents=[common])
    stop.add_argument("id")
    stop.add_argument(
        "--drain-timeout", type=float, default=None, metavar="S", help="SIGTERM -> SIGKILL seconds"
    )
    logs = sub.add_parser("logs", help="the engine output of instance ID", parents=[common])
    logs.add_argument("id")
    logs.add_argument("--tail", type=int, default=100, metavar="N")
    return p


def _token(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return n


def build_agent(cfg: AgentConfig) -> Agent:
    backend: Backend = (
        SystemdBackend(properties=cfg.systemd_properties)
        if cfg.backend == "systemd"
        else ProcessBackend(cfg.state_dir)
    )
    return Agent(cfg, backend, nvml=PynvmlProbe.open() if cfg.nvml else None)


def from_ssh(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """`argv` without `--from-ssh`, followed by the command in $SSH_ORIGINAL_COMMAND.

    The client's leading `berth-agent` and `-c FILE` are dropped (the forced command's config wins).
    """
    original = env.get("SSH_ORIGINAL_COMMAND")
    if original is None:
        raise AgentError.of(
            ErrorCode.BAD_ARGUMENTS, "--from-ssh needs $SSH_ORIGINAL_COMMAND (an ssh forced command)"
        )
    try:
        words = shlex.split(original)
    except ValueError as e:
        raise AgentError.of(ErrorCode.BAD_ARGUMENTS, f"cannot parse the ssh command: {e}") from None
    if words and Path(words[0]).name == "berth-agent":
        words = words[1:]
    while words and (words[0] in ("-c", "--config") or words[0].startswith("--config=")):
        words = words[1:] if words[0].startswith("--config=") else words[2:]
    return [a for a in argv if a != "--from-ssh"] + words


def run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Report:
    """The report of one command (raises AgentError)."""
    if "--from-ssh" in argv:
        argv = from_ssh(argv, os.environ if env is None else env)
    args = _parser().parse_args(list(argv))
    path = args.config or Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        cfg = load_agent_config(path)
    except ConfigError as e:
        raise AgentError.of(ErrorCode.CONFIG, str(e)) from None
    if args.fencing_token is not None:
        try:
            StateDir(cfg.state_dir).fence(args.fencing_token)
        except StaleFencingToken as e:
            raise AgentError.of(ErrorCode.STALE_FENCING_TOKEN, str(e)) from None
    agent = build_agent(cfg)
    if args.command == "node":
        return agent.node()
    if args.command == "list":
        return agent.instances()
    if args.command == "plan":
        return agent.plan(args.model, config=args.instance_config)
    if getattr(args, "drain_timeout", None) is not None and not args.drain_timeout >= 0:
        raise AgentError.of(ErrorCode.BAD_ARGUMENTS, "--drain-timeout must be >= 0")
    if args.command == "start":
        return agent.start(
            args.model,
            instance_id=args.instance_id,
            evict=args.evict,
            drain_timeout_s=args.drain_timeout,
            config=args.instance_config,
        )
    if args.command == "stop":
        return agent.stop(args.id, drain_timeout_s=args.drain_timeout)
    if args.command == "logs":
        return agent.logs(args.id, tail=args.tail)
    raise AgentError.of(ErrorCode.BAD_ARGUMENTS, f"unknown command {args.command!r}")  # pragma: no cover


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        _parser().parse_args(args)  # prints help text and exits 0: the one non-JSON output
    try:
        report: Report | ErrorReport = run(args)
        status = 0
    except AgentError as e:
        report, status = ErrorReport(error=e.body), e.exit_status
    sys.stdout.buffer.write(msgspec.json.encode(report) + b"\n")
    sys.stdout.flush()
    return status
