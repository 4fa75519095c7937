"""The policy the preemption tests run under (integration and engine tier): one interactive class that
may preempt one batch class on mixed endpoints, instance classes honoured."""

from __future__ import annotations

from typing import Final

POLICY: Final = """
name = "preempt-test"
[ordering]
plugin = "priority-bands"
[placement]
picker = { plugin = "max-score" }
filters = [{ plugin = "instance-class" }]
[[placement.scorers]]
plugin = "least-outstanding"
weight = 1.0
[preemption]
plugin = "least-progress"
[slo]
default_class = "chat"
[[slo.classes]]
name = "chat"
kind = "interactive"
band = 0
[[slo.classes]]
name = "bulk"
kind = "batch"
band = 1
"""

#: What a client of the batch class sends.
BATCH_HEADERS: Final = {"x-berth-slo-class": "bulk"}
