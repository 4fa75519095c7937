"""The process's life on the wired components (`gateway.app.components.Gateway`): the aiohttp apps and
their cleanup contexts in order, `serve()` (bind, first scrape round, READY=1, SIGHUP reloads, SIGTERM
drains) and the drain's first steps."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog
from aiohttp import web

from gateway.app.components import Gateway
from gateway.front.admin import is_loopback
from gateway.front.routes import add_ops_routes, add_routes

log = structlog.get_logger("berth.app")


def build_app(gw: Gateway) -> web.Application:
    # client_max_size is only a backstop: read_body enforces the configured limit with an OpenAI error.
    app = web.Application(client_max_size=gw.cfg.server.max_body_bytes + 1)
    app.cleanup_ctx.append(gw.session_ctx)
    app.cleanup_ctx.append(gw.cluster_ctx)
    app.cleanup_ctx.append(gw.fleet_ctx)
    app.cleanup_ctx.append(gw.batch_ctx)  # cleaned up first: its lines need the dispatcher
    add_routes(app, gw.services, with_ops=not gw.cfg.ops.listen)
    return app


def build_ops_app(gw: Gateway) -> web.Application:
    """The ops listener's app ([ops] listen): /metrics, /healthz, /readyz, /admin/*; its lifecycle
    is the main app's."""
    app = web.Application(client_max_size=64 * 1024)
    add_ops_routes(app, gw.services)
    return app


def warn_unauthenticated(auth_required: bool, host: str, port: int) -> None:
    """A clear warning when anyone who reaches a non-loopback listener is served without a key."""
    if auth_required or host == "localhost" or is_loopback(host):
        return
    log.warning(
        "auth_not_required",
        listen=f"{host}:{port}",
        hint="every client that reaches this address is served; set [auth] required = true",
    )


async def serve(gw: Gateway) -> None:
    """Run until SIGTERM/SIGINT; SIGHUP reloads."""
    runner = web.AppRunner(
        build_app(gw),
        handle_signals=False,
        shutdown_timeout=gw.cfg.server.drain_timeout_s,
        handler_cancellation=True,
        access_log=None,
    )
    await runner.setup()
    host, port = gw.cfg.server.host_port
    await web.TCPSite(runner, host, port, backlog=1024).start()
    warn_unauthenticated(gw.runtime.config.auth.required, host, port)
    ops_runner: web.AppRunner | None = None
    if gw.cfg.ops.listen:
        ops_runner = web.AppRunner(build_ops_app(gw), handle_signals=False, access_log=None)
        await ops_runner.setup()
        ops_host, ops_port = gw.cfg.ops.host_port
        await web.TCPSite(ops_runner, ops_host, ops_port).start()
        log.info("ops_listening", listen=gw.cfg.ops.listen)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, gw.request_reload)
    await gw.endpoints.first_round(timeout_s=gw.runtime.scrape.timeout_s * 2 + 1.0)
    if gw.lifecycle is not None:
        await gw.lifecycle.wait_answered(timeout_s=gw.lifecycle.setup.config.agent_timeout_s * 2 + 1.0)
    gw.gc.settle()  # what the process keeps for its lifetime is built: freeze it, out of the collector's way
    gw.notifier.ready()
    log.info(
        "serving",
        listen=f"{host}:{port}",
        endpoints=len(gw.runtime.endpoints),
        policy=gw.runtime.policy.name,
        ready=gw.services.ready,
    )
    try:
        await stop.wait()
        begin_drain(gw)
        await accept_grace(gw.cfg.server.accept_grace_s, stop)
    finally:
        if not gw.services.draining:
            begin_drain(gw)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        if ops_runner is not None:
            await ops_runner.cleanup()
        gw.notifier.close()
        gw.gc.close()
        log.info("stopped")


def begin_drain(gw: Gateway) -> None:
    """New requests get 503 `shutting_down` and /readyz 503 from now on; systemd hears STOPPING=1."""
    gw.services.draining = True
    gw.notifier.stopping()
    log.info("draining", timeout_s=gw.cfg.server.drain_timeout_s, accept_grace_s=gw.cfg.server.accept_grace_s)


async def accept_grace(grace_s: float, stop: asyncio.Event) -> None:
    """Keep the listener open `grace_s` after SIGTERM, or until a second SIGTERM/SIGINT: connections
    already queued for it (accepted by the kernel, not yet read) and a load balancer's last requests
    before its next /readyz get a precise 503 `shutting_down`; closing the listener at once resets them."""
    if grace_s <= 0:
        return
    stop.clear()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(grace_s):
            await stop.wait()
