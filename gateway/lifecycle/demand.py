"""What the eviction score learns from the traffic (sans-IO, shared by the live manager and the simulator).

Every request is recorded at its first placement (a resumed run of a preempted one is not a new
request): a sliding window of the last `history` requests gives each model's share of the recent traffic
(the evictor's future demand beyond the queue: a model with a small share is expected to be asked for
late), and an exponential average of each model's expected output tokens gives its criticality (short
outputs are the TTFT-critical completion traffic). `demand(queued)` combines them with the queue's
look-ahead window into the `Demand` the lifecycle's eviction plan reads.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Final

from gateway.core.types import ModelName
from gateway.lifecycle.instances import Demand
from gateway.sched.request import SchedRequest

#: Weight of the newest request in a model's expected output length (exponential average).
OUTPUT_EWMA_ALPHA: Final = 0.1
#: Recent requests whose models' shares predict demand (the sliding window's length).
DEFAULT_HISTORY: Final = 256


class DemandTracker:
    def __init__(self, history: int = DEFAULT_HISTORY, *, output_alpha: float = OUTPUT_EWMA_ALPHA) -> None:
        if history < 1:
            raise ValueError(f"history must be ≥ 1 (got {history})")
        self._recent: deque[ModelName] = deque(maxlen=history)
        self._counts: Counter[ModelName] = Counter()
        self._alpha = output_alpha
        self._expected: dict[ModelName, float] = {}

    def dispatched(self, model: ModelName, expected_output_tokens: float | None) -> None:
        """A request for `model` was placed; `expected_output_tokens`: its predicted output length, else
        its max_tokens, else None."""
        if len(self._recent) == self._recent.maxlen:
            gone = self._recent[0]
            self._counts[gone] -= 1
            if self._counts[gone] <= 0:
                del self._counts[gone]
        self._recent.append(model)
        self._counts[model] += 1
        if expected_output_tokens is not None:
            old = self._expected.get(model)
            x = float(expected_output_tokens)
            self._expected[model] = x if old is None else old + self._alpha * (x - old)

    def placed(self, req: SchedRequest) -> None:
        """The scheduler placed `req`. A resumed run of a preempted request (`preemptions > 0`) is the
        same request, counted at its first placement: counting it again would inflate its model's share
        by every preemption."""
        if req.preemptions:
            return
        expect = req.predicted_output_tokens if req.predicted_output_tokens is not None else req.max_tokens
        self.dispatched(req.model, expect)

    def shares(self) -> dict[ModelName, float]:
        n = len(self._recent)
        return {m: c / n for m, c in self._counts.items()} if n else {}

    def expected_output(self) -> dict[ModelName, float]:
        return dict(self._expected)

    def demand(self, queued: tuple[ModelName, ...]) -> Demand:
        """The `Demand` for an eviction plan: `queued` is the queue's look-ahead window."""
        return Demand(window=queued, expected_output=self.expected_output(), recent_share=self.shares())
