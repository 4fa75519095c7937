"""Console entry point: `berth serve | check | top`, plus the commands other installed packages add
through the `berth.commands` entry-point group (`berth demo` comes with loadgen's simulator: a command
there is a callable taking the arguments after its name and returning the exit status)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from gateway import __version__
from gateway.core.errors import ConfigError

#: The entry-point group of commands that other packages add to `berth`.
COMMANDS_GROUP = "berth.commands"


def _parser(plugins: Sequence[EntryPoint] = ()) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth", description="SLO-aware gateway for self-hosted LLM fleets")
    p.add_argument("--version", action="version", version=f"berth {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("-c", "--config", type=Path, help="gateway.toml (default: none; use --endpoint flags)")
    s.add_argument("--listen", help="HOST:PORT to listen on (overrides [server].listen)")
    s.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="URL[,engine=..][,class=..]",
        help="an engine endpoint: URL[,engine=vllm|sglang][,class=interactive|mixed|batch]"
        "[,models=a|b][,cap=N][,id=NAME][,node=NAME][,max_batch=N][,config=NAME]"
        "[,kv_events=tcp://HOST:PORT][,kv_events_replay=tcp://HOST:PORT]; repeatable; "
        "replaces the file's list",
    )
    s.add_argument("--policy", help="policy file (overrides [policy].file)")
    s.add_argument(
        "--batch-dir",
        help="where batches and their files live (overrides [batch].dir; default $STATE_DIRECTORY/batch "
        "under systemd, else ./berth-state/batch)",
    )
    s.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error", "critical"], help="overrides [server]"
    )

    c = sub.add_parser(
        "check",
        help="validate a gateway.toml, policy, agent.toml or models.toml file; exit 1 with the errors",
    )
    c.add_argument("-c", "--config", type=Path, required=True)

    t = sub.add_parser("top", help="live view of endpoints, queues and SLO attainment (q or Ctrl-C exits)")
    t.add_argument(
        "--url", default=None, help="the gateway's base URL (default $BERTH_URL or http://127.0.0.1:8080)"
    )
    t.add_argument("--token", default=None, help="admin token (default $BERTH_ADMIN_TOKEN)")
    t.add_argument("--once", action="store_true", help="print one frame without escape codes and exit")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between redraws (default 1)")

    for ep in plugins:
        x = sub.add_parser(ep.name, help=f"(from {ep.module.split('.')[0]}; `berth {ep.name} --help`)")
        x.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}
    if argv and argv[0] in plugins:  # its own parser reads its arguments
        command: Callable[[Sequence[str]], int] = plugins[argv[0]].load()
        return command(argv[1:])
    args = _parser(list(plugins.values())).parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check":
        return _check(args.config)
    if args.command == "top":
        return _top(args)
    return 2


def _top(args: argparse.Namespace) -> int:
    import os

    from gateway.config.load import ADMIN_TOKEN_ENV
    from gateway.top import DEFAULT_URL, run

    url = args.url or os.environ.get("BERTH_URL") or DEFAULT_URL
    token = args.token or os.environ.get(ADMIN_TOKEN_ENV) or None
    if not args.interval > 0:
        print("berth top: --interval must be positive", file=sys.stderr)
        return 2
    return run(url, token, once=args.once, interval_s=args.interval)


def _check(path: Path) -> int:
    from gateway.config.check import check_file

    report = check_file(path)
    for line in report.problems:
        print(line, file=sys.stderr)
    if report.problems:
        print(report.summary(path), file=sys.stderr)
        return 1
    print(report.summary(path))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gateway.app import Gateway, ServeOptions, serve
    from gateway.config import (
        apply_overrides,
        default_config,
        load_gateway_config,
        load_runtime,
        parse_endpoint_flag,
    )
    from gateway.core.logging import configure_logging
    from gateway.core.runloop import run
    from gateway.sched.plugins import default_registry

    try:
        endpoints = tuple(parse_endpoint_flag(v) for v in args.endpoint)
        base = load_gateway_config(args.config) if args.config else default_config()
        cfg = apply_overrides(
            base, listen=args.listen, endpoints=endpoints, policy_file=args.policy, batch_dir=args.batch_dir
        )
        if not cfg.endpoints and cfg.lifecycle is None:
            raise ConfigError(
                "no endpoints: give --endpoint URL, list [[endpoints]] in the config file, "
                "or configure [lifecycle] and [[nodes]] to start models on demand"
            )
        options = ServeOptions(
            config_path=args.config, listen=args.listen, endpoints=endpoints, policy_file=args.policy
        )
        registry = default_registry()
        runtime = load_runtime(
            args.config, cfg, registry, listen=args.listen, endpoints=endpoints, policy_file=args.policy
        )
    except ConfigError as e:
        print(f"berth: {e}", file=sys.stderr)
        return 2
    configure_logging(args.log_level or cfg.server.log_level)
    run(serve(Gateway(runtime, cfg, options, registry=registry)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
