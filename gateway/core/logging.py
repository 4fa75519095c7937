"""structlog configured once, with the performance recipe: orjson renderer, bytes logger, contextvars.

Events are snake_case facts with fields. Headers and API keys are never logged.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, BinaryIO

import orjson
import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def configure_logging(level: str = "info", stream: BinaryIO | None = None) -> None:
    if level not in _LEVELS:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}")
    out = stream if stream is not None else sys.stderr.buffer
    structlog.configure(
        cache_logger_on_first_use=True,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_dumps),
        ],
        logger_factory=structlog.BytesLoggerFactory(file=out),
    )


def _dumps(obj: Any, **_: Any) -> bytes:
    return orjson.dumps(obj, default=str)
