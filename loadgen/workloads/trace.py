"""Trace replay: a JSONL file, one request per line, replayed at its recorded offsets.

Fields of a line (``--record`` writes the same fields plus an ``observed`` object, so a recording
replays as is):

| field             | meaning                                                                  |
| ----------------- | ------------------------------------------------------------------------ |
| `at`              | arrival offset in seconds from the start of the run (required)           |
| `model`           | literal model name; or `model_slot` (int, default 0) to map as usual     |
| `api`             | `chat` (default) or `completion`                                          |
| `class`           | report class (default `default`)                                          |
| `prompt_tokens`   | prompt length (required)                                                  |
| `prompt`          | what the prompt says, when its workload gave it a structure: messages     |
|                   | `{"role", "spans": [[space, key, tokens], ...]}` (`workloads/prompt.py`); |
|                   | they must make `prompt_tokens` tokens. Without it a call sends text of its own |
| `output_tokens`   | output length, pinned with min_tokens = max_tokens (required)             |
| `slo`             | `{"ttft_ms", "atgt_ms", "e2e_ms"}`, each optional                          |
| `slo_class`       | sent as `x-berth-slo-class`                                                |
| `slo_headers`     | true: the SLO is sent as `x-berth-ttft-ms` / `-itl-ms` / `-deadline-ms`   |
| `priority`        | sent as the request's `priority`                                           |
| `gap_before_s`    | client-side delay before sending (inside a task)                           |
| `task_id`         | lines sharing a task id form one task; its calls run in line order, the task |
|                   | starting at its first line's `at` (later lines' `at` are ignored)        |
| `task_type`, `task_sla_ms`, `task_sla_metric` (`ttft`/`e2e`) | the task's type and SLA          |

``--rate`` does not apply to a trace; ``--time-scale K`` multiplies the arrival offsets (2: twice as
long, half the rate); ``--duration`` drops tasks starting at or after it, scaled (0: keep all).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from loadgen.workloads.base import CallSpec, Slo, TaskSpec
from loadgen.workloads.prompt import Message, Prompt, Span


class TraceError(ValueError):
    pass


def _num(v: Any, where: str, *, optional: bool = False) -> float | None:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TraceError(f"{where}: must be a number")
    return float(v)


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise TraceError(f"{where}: must be a positive integer")
    return v


_ROLES = ("system", "user", "assistant")


def _prompt(obj: Any, where: str) -> Prompt:
    """A recorded prompt: a list of messages ``{"role", "spans": [[space, key, tokens], ...]}``."""
    if not isinstance(obj, list) or not obj:
        raise TraceError(f"{where}: must be a non-empty list of messages")
    messages: list[Message] = []
    for i, m in enumerate(obj):
        at = f"{where}[{i}]"
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("spans"), list):
            raise TraceError(f"{at}: must be {{'role': system|user|assistant, 'spans': [...]}}")
        spans: list[Span] = []
        for j, sp in enumerate(m["spans"]):
            ok = isinstance(sp, list) and len(sp) == 3 and isinstance(sp[0], str)
            ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sp[1:])
            if not ok:
                raise TraceError(
                    f"{at}.spans[{j}]: must be [space, key, tokens] (a string, two integers >= 0)"
                )
            spans.append(Span(sp[0], sp[1], sp[2]))
        messages.append(Message(m["role"], tuple(spans)))
    return Prompt(tuple(messages))


def prompt_fields(prompt: Prompt) -> list[dict[str, Any]]:
    """A prompt as a trace line's `prompt` field."""
    return [{"role": m.role, "spans": [[s.space, s.key, s.tokens] for s in m.spans]} for m in prompt.messages]


def parse_line(obj: Any, where: str) -> tuple[float, CallSpec, dict[str, Any]]:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: a line must be a JSON object")
    at = _num(obj.get("at"), f"{where}.at")
    assert at is not None
    slo_obj = obj.get("slo") or {}
    if not isinstance(slo_obj, dict):
        raise TraceError(f"{where}.slo: must be an object")
    slo = Slo(
        ttft_ms=_num(slo_obj.get("ttft_ms"), f"{where}.slo.ttft_ms", optional=True),
        atgt_ms=_num(slo_obj.get("atgt_ms"), f"{where}.slo.atgt_ms", optional=True),
        e2e_ms=_num(slo_obj.get("e2e_ms"), f"{where}.slo.e2e_ms", optional=True),
    )
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise TraceError(f"{where}.model: must be a string")
    api = obj.get("api", "chat")
    if api not in ("chat", "completion"):
        raise TraceError(f"{where}.api: must be chat or completion")
    slot = obj.get("model_slot", 0)
    if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
        raise TraceError(f"{where}.model_slot: must be a non-negative integer")
    prio = obj.get("priority")
    if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)):
        raise TraceError(f"{where}.priority: must be an integer")
    call = CallSpec(
        prompt_tokens=_int(obj.get("prompt_tokens"), f"{where}.prompt_tokens"),
        output_tokens=_int(obj.get("output_tokens"), f"{where}.output_tokens"),
        model_slot=slot,
        model=model,
        api=api,
        cls=str(obj.get("class", "default")),
        slo=slo,
        slo_class=None if obj.get("slo_class") is None else str(obj["slo_class"]),
        priority=prio,
        gap_before_s=_num(obj.get("gap_before_s", 0.0), f"{where}.gap_before_s") or 0.0,
    )
    if obj.get("prompt") is not None:
        prompt = _prompt(obj["prompt"], f"{where}.prompt")
        tokens = prompt.tokens(call.api)
        if tokens != call.prompt_tokens:
            raise TraceError(
                f"{where}.prompt: makes {tokens} tokens, prompt_tokens says {call.prompt_tokens}"
            )
        call = dataclasses.replace(call, prompt=prompt)
    if obj.get("slo_headers") is not None:
        if not isinstance(obj["slo_headers"], bool):
            raise TraceError(f"{where}.slo_headers: must be true or false")
        call = dataclasses.replace(call, slo_headers=obj["slo_headers"])
    return at, call, obj


def load_trace(path: str | Path, *, duration_s: float = 0.0) -> list[TaskSpec]:
    path = Path(path)
    groups: dict[str, list[tuple[float, CallSpec, dict[str, Any]]]] = {}
    order: list[str] = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise TraceError(f"{path}: {e}") from None
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise TraceError(f"{where}: {e}") from None
        at, call, fields = parse_line(obj, where)
        key = str(fields["task_id"]) if fields.get("task_id") is not None else f"\0line{n}"
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((at, call, fields))
    tasks: list[TaskSpec] = []
    for key in order:
        entries = groups[key]
        at, _, first = entries[0]
        if duration_s > 0 and at >= duration_s:
            continue
        metric = first.get("task_sla_metric", "e2e")
        if metric not in ("ttft", "e2e"):
            raise TraceError(f"{path}: task {key!r}: task_sla_metric must be ttft or e2e")
        sla = first.get("task_sla_ms")
        tasks.append(
            TaskSpec(
                index=0,
                at_s=at,
                task_type=str(first.get("task_type", entries[0][1].cls)),
                calls=tuple(c for _, c, _ in entries),
                task_sla_ms=None if sla is None else float(sla),
                sla_metric=metric,
                task_id=None if key.startswith("\0") else key,
            )
        )
    tasks.sort(key=lambda t: t.at_s)
    return [
        TaskSpec(i, t.at_s, t.task_type, t.calls, t.task_sla_ms, t.sla_metric, t.task_id)
        for i, t in enumerate(tasks)
    ]


class TraceWorkload:
    def __init__(self, path: str | Path, *, time_scale: float = 1.0) -> None:
        self.path = Path(path)
        self.time_scale = time_scale  # arrival offsets are multiplied by it (--time-scale)
        self.name = f"trace:{self.path.name}"

    def schedule(
        self,
        rate: float,
        duration_s: float,
        arrivals: Callable[[float, float], list[float]],
        rng: random.Random,
    ) -> list[TaskSpec]:
        if self.time_scale == 1.0:
            return load_trace(self.path, duration_s=duration_s)
        tasks = [dataclasses.replace(t, at_s=t.at_s * self.time_scale) for t in load_trace(self.path)]
        return [t for t in tasks if duration_s <= 0 or t.at_s < duration_s]


def trace_line(task: TaskSpec, call_index: int, model: str, at_s: float) -> dict[str, Any]:
    """The trace fields of one sent call (what `--record` writes before its observations)."""
    call = task.calls[call_index]
    line: dict[str, Any] = {
        "at": round(at_s, 6),
        "model": model,
        "model_slot": call.model_slot,
        "api": call.api,
        "class": call.cls,
        "prompt_tokens": call.prompt_tokens,
        "output_tokens": call.output_tokens,
        "slo": call.slo.to_dict(),
        "slo_class": call.slo_class,
        "priority": call.priority,
        "gap_before_s": call.gap_before_s,
        "task_type": task.task_type,
    }
    if call.prompt is not None:
        line["prompt"] = prompt_fields(call.prompt)
    if call.slo_headers:
        line["slo_headers"] = True
    if task.task_id is not None:
        line["task_id"] = task.task_id
        line["task_sla_ms"] = task.task_sla_ms
        line["task_sla_metric"] = task.sla_metric
    return line
