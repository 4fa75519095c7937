"""Logging configuration: the level hot paths read, and the JSON line at info."""

from __future__ import annotations

import io
from collections.abc import Iterator

import orjson
import pytest
import structlog

from gateway.core.logging import LEVEL, configure_logging


@pytest.fixture
def restore() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    LEVEL.info = True


@pytest.mark.usefixtures("restore")
def _info_on() -> bool:
    return LEVEL.info


def test_the_level_flag_follows_the_configured_level() -> None:
    out = io.BytesIO()
    configure_logging("warning", stream=out)
    assert _info_on() is False
    structlog.get_logger("t").info("skipped")
    assert out.getvalue() == b""
    configure_logging("info", stream=out)
    assert _info_on() is True
    structlog.get_logger("t").info("written", n=1)
    line = orjson.loads(out.getvalue().splitlines()[-1])
    assert (line["event"], line["n"], line["level"]) == ("written", 1, "info")
    configure_logging("debug", stream=out)
    assert _info_on() is True


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="log level"):
        configure_logging("loud")
