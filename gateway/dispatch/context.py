"""Everything known about one request as it moves through the phases; the finish phase logs it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.core.errors import BerthError
from gateway.core.slo import TaskCall
from gateway.core.types import ApiKind, EndpointId
from gateway.sched.request import SchedRequest
from gateway.telemetry.prefix_keys import PromptKeys


@dataclass(slots=True)
class RequestContext:
    id: str
    api: ApiKind
    arrival: float
    client_model: str = ""
    served_model: str = ""
    stream: bool = False
    slo_class: str = "default"
    endpoint: EndpointId | None = None
    dispatched_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    status: int = 0
    outcome: str = "ok"
    error: BerthError | None = None
    attempts: int = 0
    preemptions: int = 0  # times the scheduler preempted it (each followed by a resume or an end)
    prompt_tokens: int | None = None
    # The prompt's token ids as the engine tokenizes it: known when the precise prefix source is on
    # (the prefix index matches a request by them) or the prompt was sent as token ids; else None.
    prompt_token_ids: tuple[int, ...] | None = None
    output_tokens: int = 0
    # A stream's inter-token gaps (the relay's list once it ended; none until then, nor for an answer
    # that came whole).
    itl_gaps: Sequence[float] = ()
    # For telemetry: the scheduler's view of the request (None until admitted) and the prompt's characters.
    sched: SchedRequest | None = None
    task: TaskCall | None = None  # a call of a multi-step task: its place on the task clock
    prompt_chars: int = 0
    # The prefix index's keys of its prompt (None: not indexed), the prompt tokens predicted cached on
    # the endpoint it was dispatched to, and the text it produced (a stream's; for the next turn's reuse).
    prefix_keys: PromptKeys | None = None
    cached_tokens: int = 0
    answer_text: str | None = None

    def fail(self, err: BerthError) -> None:
        # Kept without its traceback: the traceback holds the frames it passed through, one of which
        # holds this context, a cycle only the cyclic collector frees (on a stream of refused requests,
        # ~55 objects each, that made the collector's young pass take milliseconds).
        self.error = err.with_traceback(None)
        self.status = err.status
        self.outcome = err.outcome

    @property
    def queue_s(self) -> float | None:
        return None if self.dispatched_at is None else self.dispatched_at - self.arrival

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrival
