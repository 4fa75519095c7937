"""The composition root: builds every long-lived component once, wires them, and owns the process's life.

Lifecycle through `cleanup_ctx`, in dependency order: upstream session, engine-call pool and scrape
client (and the dispatcher on them) -> fleet (endpoint set and its scrapers, queue ticker, telemetry
loop, systemd watchdog). `serve()` binds, waits for the first scrape round, tells systemd READY=1,
reloads on SIGHUP and drains on SIGTERM.

Reload is a transaction: the new runtime configuration is built aside and, only when it is whole, pushed
to each component that takes reloadable settings (scheduler, endpoint set, telemetry, front).
"""

from gateway.app.components import (
    QUEUE_TICK_S,
    Gateway,
    ServeOptions,
    batch_dir,
    batch_runner,
    published_load,
)
from gateway.app.process import (
    accept_grace,
    begin_drain,
    build_app,
    build_ops_app,
    serve,
    warn_unauthenticated,
)

# Importers keep `from gateway.app import ...`: the components and the process's life are modules of
# their own (gateway.app.components, gateway.app.process).
__all__ = [
    "QUEUE_TICK_S",
    "Gateway",
    "ServeOptions",
    "accept_grace",
    "batch_dir",
    "batch_runner",
    "begin_drain",
    "build_app",
    "build_ops_app",
    "published_load",
    "serve",
    "warn_unauthenticated",
]
