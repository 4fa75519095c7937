"""Mooncake-format trace replay: blocks of text per hash id (equal ids equal text and tokens, different ids
different ones), timing, model mapping, SLOs and headers, and errors that name the line."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.client import build_body, build_headers
from loadgen.engine_sim.protocol import completion_prompt_tokens
from loadgen.prompts import MAX_KEY
from loadgen.runner import RunOptions, build_schedule
from loadgen.workloads import WorkloadOptions, get_workload
from loadgen.workloads.base import TaskSpec
from loadgen.workloads.mooncake import BLOCK_TOKENS, MooncakeError, MooncakeLine, block_spans, read_trace
from loadgen.workloads.prompt import Message, Prompt
from loadgen.workloads.stats import reusable_share

FIXTURE = Path(__file__).parent / "data" / "mooncake_small.jsonl"
BLOCK_CHARS = 4 * BLOCK_TOKENS


def replay(
    path: Path = FIXTURE, options: WorkloadOptions | None = None, *, duration: float = 0.0, seed: int = 0
) -> list[TaskSpec]:
    spec = f"mooncake:{path}"
    run = RunOptions(target="x", workload=spec, duration_s=duration, seed=seed)
    return build_schedule(get_workload(spec, options), run)


def text_of(line: MooncakeLine, space: str = "mc", request: int = 0) -> str:
    return Prompt((Message("user", block_spans(line, space, request)),)).completion_text()


def prompt_text(task: TaskSpec) -> str:
    body = orjson.loads(build_body(task.calls[0], "m", salt=0))
    text = body["prompt"]
    assert isinstance(text, str)
    return text


def test_the_fixture_replays_every_line_with_its_lengths() -> None:
    lines = read_trace(FIXTURE)
    tasks = replay()
    assert len(tasks) == len(lines) == 10
    for task, line in zip(tasks, lines, strict=True):  # the fixture is in time order
        (call,) = task.calls
        assert task.at_s == pytest.approx(line.timestamp / 1000.0)
        assert call.api == "completion"
        assert call.prompt_tokens == line.input_length
        assert call.output_tokens == line.output_length
        text = prompt_text(task)
        assert completion_prompt_tokens(text) == len(text) // 4 == line.input_length
        assert call.slo.ttft_ms is None
        assert call.slo_class is None
        headers = build_headers(task, call, {}, slo_scale=1.0, slo_headers=False)
        assert not any(h.startswith("x-berth-") for h in headers)  # the policy's default class applies


def test_shared_leading_ids_are_shared_leading_blocks() -> None:
    texts = [prompt_text(t) for t in replay()]
    # lines 1, 2 and 4 share ids [0, 1]; 2 and 4 also [3, 4]; line 7 is ids [0, 1] exactly
    assert texts[1][: 2 * BLOCK_CHARS] == texts[0][: 2 * BLOCK_CHARS]
    assert (
        texts[1][2 * BLOCK_CHARS : 2 * BLOCK_CHARS + 40] != texts[0][2 * BLOCK_CHARS : 2 * BLOCK_CHARS + 40]
    )
    assert texts[3][: 4 * BLOCK_CHARS] == texts[1]
    assert texts[6] == texts[0][: 2 * BLOCK_CHARS]
    # the partial last block is the start of the full block of the same id
    assert texts[0] == texts[9][: len(texts[0])]
    assert texts[2] == texts[4][: len(texts[2])]


def test_the_reusable_share_is_the_hash_ids_share() -> None:
    """At 512-token blocks the text's share is the share an id count over full blocks gives."""
    lines = read_trace(FIXTURE)
    seen: set[tuple[int, ...]] = set()
    reused = total = 0
    for line in lines:
        for k in range(line.input_length // BLOCK_TOKENS):
            prefix = tuple(line.hash_ids[: k + 1])
            total += 1
            reused += prefix in seen
            seen.add(prefix)
    stats = reusable_share(replay(), block_tokens=BLOCK_TOKENS)
    assert (stats.blocks, stats.reused) == (total, reused) == (25, 12)


IDS = st.lists(st.integers(0, MAX_KEY), min_size=1, max_size=6)


@given(IDS, IDS, st.integers(1, BLOCK_TOKENS))
def test_equal_ids_give_equal_blocks_and_different_ids_different_ones(
    a: list[int], b: list[int], last: int
) -> None:
    la = MooncakeLine(0, (len(a) - 1) * BLOCK_TOKENS + last, 1, a)
    lb = MooncakeLine(0, len(b) * BLOCK_TOKENS, 1, b)
    ta, tb = text_of(la, request=1), text_of(lb, request=2)
    assert len(ta) == 4 * la.input_length
    assert len(tb) == 4 * lb.input_length
    for k in range(min(len(a), len(b))):
        block_a = ta[k * BLOCK_CHARS : (k + 1) * BLOCK_CHARS]
        block_b = tb[k * BLOCK_CHARS : (k + 1) * BLOCK_CHARS]
        if a[k] == b[k]:
            assert block_b.startswith(block_a)  # equal (the last one of `a` may be partial)
        elif len(block_a) >= 40:
            assert block_a != block_b[: len(block_a)]


def test_blocks_the_ids_do_not_cover_get_text_of_their_own() -> None:
    short = MooncakeLine(0, 3 * BLOCK_TOKENS, 1, [7])
    a, b = text_of(short, request=1), text_of(short, request=2)
    assert len(a) == len(b) == 3 * BLOCK_CHARS
    assert a[:BLOCK_CHARS] == b[:BLOCK_CHARS]
    assert a[BLOCK_CHARS:] != b[BLOCK_CHARS:]
    surplus = MooncakeLine(0, 100, 1, [7, 8, 9])
    assert text_of(surplus) == a[:400]


def test_time_scale_and_duration() -> None:
    tasks = replay(options=WorkloadOptions(time_scale=0.5), duration=1.0)
    assert [t.at_s for t in tasks] == pytest.approx([0.0, 0.125, 0.2, 0.45, 0.6, 0.9])
    assert [t.index for t in tasks] == list(range(6))


def test_seeds_keep_the_structure_with_other_words() -> None:
    a, b = replay(seed=1), replay(seed=2)
    assert prompt_text(a[0]) != prompt_text(b[0])
    assert prompt_text(a[0]) == prompt_text(replay(seed=1)[0])
    assert reusable_share(a, block_tokens=16).reused == reusable_share(b, block_tokens=16).reused


def write(tmp_path: Path, *lines: dict[str, object] | bytes) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else orjson.dumps(x) for x in lines) + b"\n")
    return path


def line(**fields: object) -> dict[str, object]:
    return {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2], **fields}


def test_models_map_to_slots_in_order_of_appearance(tmp_path: Path) -> None:
    path = write(
        tmp_path, line(model="big"), line(timestamp=5, model="small"), line(timestamp=9, model="big")
    )
    tasks = replay(path)
    assert [t.calls[0].model_slot for t in tasks] == [0, 1, 0]
    assert all(t.calls[0].model is None for t in tasks)  # --models or the target's list maps the slots


def test_slos_per_request_per_flag_and_per_class(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        line(ttft_ms=300, itl_ms=20),
        line(timestamp=1, slo_class="batch"),
        line(timestamp=2, extra="ignored"),
        b"",
        line(timestamp=3, output_length=0),
    )
    tasks = replay(path, WorkloadOptions(slo_ttft_ms=900.0, slo_itl_ms=50.0))
    own, cls, flag, zero = (t.calls[0] for t in tasks)
    assert (own.slo.ttft_ms, own.slo.atgt_ms) == (300, 20)  # the line's own SLO wins
    assert (flag.slo.ttft_ms, flag.slo.atgt_ms) == (900, 50)
    assert (cls.slo_class, cls.cls) == ("batch", "batch")
    assert zero.output_tokens == 1
    headers = build_headers(tasks[0], own, {}, slo_scale=1.0, slo_headers=False)
    assert (headers["x-berth-ttft-ms"], headers["x-berth-itl-ms"]) == ("300", "20")
    assert "x-berth-deadline-ms" not in headers
    assert build_headers(tasks[1], cls, {}, slo_scale=1.0, slo_headers=False)["x-berth-slo-class"] == "batch"
    plain = replay(path)[2].calls[0]
    assert plain.slo.ttft_ms is None
    assert not plain.slo_headers


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (b"{bad", "not JSON"),
        (b"[1, 2]", "Expected `object`"),
        (orjson.dumps({"input_length": 5, "output_length": 1, "hash_ids": [1]}), "`timestamp`"),
        (orjson.dumps(line(input_length=0)), "$.input_length"),
        (orjson.dumps(line(input_length="7")), "$.input_length"),
        (orjson.dumps(line(output_length=-1)), "$.output_length"),
        (orjson.dumps(line(hash_ids=[1, -2])), "$.hash_ids[1]"),
        (
            b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [%d]}' % (MAX_KEY + 1),
            "hash_ids",
        ),
        (orjson.dumps(line(hash_ids="1,2")), "$.hash_ids"),
        (orjson.dumps(line(timestamp=-5)), "$.timestamp"),
        (orjson.dumps(line(ttft_ms=0)), "$.ttft_ms"),
    ],
    ids=[
        "json",
        "array",
        "no-timestamp",
        "zero-input",
        "string-input",
        "negative-output",
        "negative-id",
        "huge-id",
        "ids-not-a-list",
        "negative-time",
        "zero-slo",
    ],
)
def test_malformed_lines_name_the_line(tmp_path: Path, bad: bytes, fragment: str) -> None:
    path = write(tmp_path, line(), line(timestamp=3), bad)
    with pytest.raises(MooncakeError) as e:
        get_workload(f"mooncake:{path}")
    assert f"{path}:3:" in str(e.value)
    assert fragment in str(e.value)


def test_a_missing_or_empty_trace(tmp_path: Path) -> None:
    with pytest.raises(MooncakeError, match="No such file"):
        get_workload(f"mooncake:{tmp_path / 'none.jsonl'}")
    (tmp_path / "empty.jsonl").write_bytes(b"\n\n")
    with pytest.raises(MooncakeError, match="no requests"):
        get_workload(f"mooncake:{tmp_path / 'empty.jsonl'}")
    with pytest.raises(ValueError, match="mooncake:PATH"):
        get_workload("mooncake:")
    with pytest.raises(ValueError, match="--sessions does not apply"):
        get_workload(f"mooncake:{FIXTURE}", WorkloadOptions(sessions=2))


def test_block_count_rule() -> None:
    for n in (1, 511, 512, 513, 5000):
        spans = block_spans(MooncakeLine(0, n, 1, list(range(20))), "s", 0)
        assert len(spans) == math.ceil(n / BLOCK_TOKENS)
        assert sum(s.tokens for s in spans) == n
