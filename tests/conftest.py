"""Fixtures every tier shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadgen.harness import port_block


@pytest.fixture
def agent_ports() -> Iterator[tuple[int, int]]:
    """(first, last) of a block of ports for the engines a test's node agent starts (its `port_range`),
    this test's alone while it runs (`loadgen.harness.port_block`)."""
    with port_block() as block:
        yield block
