"""``mooncake:PATH``: replay of a trace in the Mooncake format (FAST'25 release), prefixes included.

One request a line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, ...]}

- ``timestamp``: ms; a request is sent ``(timestamp − the trace's first timestamp) / 1000 × time_scale``
  seconds into the run (``--time-scale 2``: twice as long, half the rate); lines may come in any order;
- ``input_length`` / ``output_length``: tokens (an output of 0 is sent as 1: engines need one);
- ``hash_ids``: one id per 512-token block of the prompt, in order; the last block may be partial
  (``len(hash_ids) == ceil(input_length / 512)``). Each id stands for a block of text of its own: equal
  ids give equal text and tokens, different ids different ones (`loadgen.prompts`), so requests sharing
  leading ids share that prefix at the engine and in any index. Ids beyond the prompt's blocks are
  ignored; blocks beyond the ids get text of their own.

Optional fields of a line (not in the Mooncake traces; other fields are ignored):
``model`` (the k-th distinct model of the trace goes to model slot k, mapped by ``--models`` or the
target's model list), ``slo_class`` (sent as ``x-berth-slo-class``, the report class too), ``ttft_ms``
and ``itl_ms`` (the request's SLO, sent as ``x-berth-ttft-ms`` / ``x-berth-itl-ms``; the flags
``--slo-ttft-ms`` / ``--slo-itl-ms`` give it to the lines without one). A request without either has no
SLO of its own: the policy's default class applies (or its class's).

Requests go out on the completions API, the prompt as text: one token a word, so block ``k`` starts at
token ``512·k`` exactly on the engine simulator. The text depends on the run's seed (the same seed
replays the same text; another seed keeps the structure with other words, so a live fleet's caches
start cold). ``--duration`` drops requests sent at or after it (0: keep all).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Final

import msgspec

from loadgen.prompts import MAX_KEY
from loadgen.workloads.base import CallSpec, Slo, TaskSpec
from loadgen.workloads.options import WorkloadOptions
from loadgen.workloads.prompt import Message, Prompt, Span

#: Tokens a hash id stands for (the Mooncake traces' block size).
BLOCK_TOKENS: Final = 512
_Positive = Annotated[float, msgspec.Meta(gt=0)]


class MooncakeError(ValueError):
    pass


class MooncakeLine(msgspec.Struct, frozen=True):
    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    input_length: Annotated[int, msgspec.Meta(ge=1)]
    output_length: Annotated[int, msgspec.Meta(ge=0)]
    hash_ids: list[Annotated[int, msgspec.Meta(ge=0)]]  # at most MAX_KEY (read_trace checks)
    model: str | None = None
    slo_class: str | None = None
    ttft_ms: _Positive | None = None
    itl_ms: _Positive | None = None


_DECODER: Final = msgspec.json.Decoder(MooncakeLine)


def read_trace(path: str | Path) -> list[MooncakeLine]:
    """The trace's lines in file order (blank lines skipped); an error names the file, line and field."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise MooncakeError(f"{path}: {e}") from None
    lines: list[MooncakeLine] = []
    for n, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            parsed = _DECODER.decode(line)
        except msgspec.ValidationError as e:
            raise MooncakeError(f"{path}:{n}: {e}") from None
        except msgspec.DecodeError as e:
            raise MooncakeError(f"{path}:{n}: not JSON: {e}") from None
        if any(h > MAX_KEY for h in parsed.hash_ids):
            raise MooncakeError(f"{path}:{n}: a hash id is over {MAX_KEY} - at `$.hash_ids`")
        lines.append(parsed)
    if not lines:
        raise MooncakeError(f"{path}: no requests")
    return lines


def block_spans(line: MooncakeLine, space: str, request: int) -> tuple[Span, ...]:
    """The prompt's blocks: one span per hash id (the last one cut to the prompt's length), then text of
    the request's own for blocks the ids do not cover."""
    n_blocks = math.ceil(line.input_length / BLOCK_TOKENS)
    spans: list[Span] = []
    for k in range(n_blocks):
        size = min(BLOCK_TOKENS, line.input_length - k * BLOCK_TOKENS)
        if k < len(line.hash_ids):
            spans.append(Span(space, line.hash_ids[k], size))
        else:
            spans.append(Span(space + "/own", request * 4096 + k, size))
    return tuple(spans)


class MooncakeWorkload:
    def __init__(self, path: str | Path, options: WorkloadOptions | None = None) -> None:
        self.path = Path(path)
        self.options = options or WorkloadOptions()
        self.lines = read_trace(self.path)  # parsed once, here: a malformed trace fails before the run
        self.name = f"mooncake:{self.path.name}"

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        opts = self.options
        scale = opts.time_scale or 1.0
        space = f"mooncake{rng.getrandbits(32)}"
        first = min(line.timestamp for line in self.lines)
        slots: dict[str, int] = {}
        timed: list[tuple[float, int, CallSpec]] = []
        for i, line in enumerate(self.lines):
            at = (line.timestamp - first) / 1000.0 * scale
            if duration_s > 0 and at >= duration_s:
                continue
            slot = 0 if line.model is None else slots.setdefault(line.model, len(slots))
            ttft = line.ttft_ms if line.ttft_ms is not None else opts.slo_ttft_ms
            itl = line.itl_ms if line.itl_ms is not None else opts.slo_itl_ms
            prompt = Prompt((Message("user", block_spans(line, space, i)),))
            call = CallSpec(
                prompt_tokens=line.input_length,
                output_tokens=max(1, line.output_length),
                model_slot=slot,
                api="completion",
                cls=line.slo_class or "default",
                slo=Slo(ttft_ms=ttft, atgt_ms=itl),
                slo_class=line.slo_class,
                prompt=prompt,
                slo_headers=ttft is not None or itl is not None,
            )
            timed.append((at, i, call))
        timed.sort(key=lambda x: (x[0], x[1]))
        return [TaskSpec(k, at, "mooncake", (call,)) for k, (at, _, call) in enumerate(timed)]
