"""The batch runner over the real SQLite store and a scripted LineRunner: a full disk while recording an
answer or while finalizing loses nothing; an engine's refusal is that line's answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.batch.lines import LineAnswer, LineRequest
from gateway.batch.metrics import BatchMetrics
from gateway.batch.model import BatchRecord, BatchStatus, FileRecord, LineResult
from gateway.batch.runner import FINALIZE_RETRY_S, BatchRunner, BatchSettings
from gateway.batch.sqlite_store import SqliteBatchStore
from gateway.batch.validate import BodyCheck

CHAT = "/v1/chat/completions"
T0 = 1_800_000_000.0


class Lines:
    """Answers each line at once: 200 with its prompt echoed, or `refuse` for the prompts listed."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.refuse = refuse
        self.runs: list[str] = []

    def checker(self) -> BodyCheck:
        return lambda endpoint, body: None

    def accepting(self) -> bool:
        return True

    async def run(self, line: LineRequest) -> LineAnswer:
        prompt = orjson.loads(line.body)["messages"][0]["content"]
        self.runs.append(prompt)
        if prompt in self.refuse:
            return LineAnswer(400, b'{"error": {"message": "no", "type": "BadRequestError"}}')
        return LineAnswer(200, orjson.dumps({"echo": prompt}), prompt_tokens=2, completion_tokens=1)


class FlakyStore(SqliteBatchStore):
    """Fails the first `record_failures` answers and the first `finish_failures` finalizations."""

    def __init__(self, path: Path, *, record_failures: int = 0, finish_failures: int = 0) -> None:
        super().__init__(path)
        self.record_failures = record_failures
        self.finish_failures = finish_failures
        self.failed = asyncio.Event()

    async def record_result(self, batch_id: str, result: LineResult) -> BatchRecord | None:
        if self.record_failures:
            self.record_failures -= 1
            self.failed.set()
            raise OSError(28, "No space left on device")
        return await super().record_result(batch_id, result)

    async def finish_batch(self, rec: BatchRecord, files: Any) -> None:
        if self.finish_failures:
            self.finish_failures -= 1
            self.failed.set()
            raise OSError(28, "No space left on device")
        await super().finish_batch(rec, files)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[list[BatchRunner]]:
    runners: list[BatchRunner] = []
    yield runners
    for r in runners:
        await r.close()


async def _start(
    tmp_path: Path, store: SqliteBatchStore, lines: Lines, runners: list[BatchRunner]
) -> BatchRunner:
    clock = Clock()
    runner = BatchRunner(
        store, BatchSettings(dir=tmp_path, max_lines_in_flight=2), lines, BatchMetrics(), wall=clock
    )
    runners.append(runner)
    await runner.ensure_open()
    runner._tasks.spawn("feeder", runner.run)  # the runner's own supervisor: closed with it
    return runner


async def _submit(runner: BatchRunner, n: int) -> BatchRecord:
    data = b"".join(
        orjson.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": "m", "messages": [{"role": "user", "content": f"p{i}"}]},
            }
        )
        + b"\n"
        for i in range(n)
    )
    runner.files.ensure()
    upload = runner.files.upload("file-in", 1 << 20)
    await upload.write(data)
    await upload.commit()
    await runner.store.add_file(
        FileRecord(
            id="file-in", owner="t", purpose="batch", filename="in.jsonl", bytes=len(data), created_at=1
        )
    )
    return await runner.create("t", "file-in", CHAT, "24h", None)


def _lines(runner: BatchRunner, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [orjson.loads(x) for x in runner.files.path(file_id).read_bytes().splitlines()]


async def test_an_engine_refusal_is_the_lines_answer(tmp_path: Path, running: list[BatchRunner]) -> None:
    runner = await _start(
        tmp_path, SqliteBatchStore(tmp_path / "b.sqlite3"), Lines(frozenset({"p1"})), running
    )
    rec = await _submit(runner, 4)
    await runner.wait_ended(rec.id)
    done = await runner.store.get_batch("t", rec.id)
    assert done is not None
    assert (done.status, done.completed, done.failed) == (BatchStatus.COMPLETED, 3, 1)
    assert (done.input_tokens, done.output_tokens) == (6, 3)
    assert [x["custom_id"] for x in _lines(runner, done.output_file_id)] == ["c0", "c2", "c3"]
    [err] = _lines(runner, done.error_file_id)
    assert (err["custom_id"], err["response"]["status_code"]) == ("c1", 400)


async def test_a_full_disk_while_recording_runs_the_line_again(
    tmp_path: Path, running: list[BatchRunner]
) -> None:
    lines = Lines()
    store = FlakyStore(tmp_path / "b.sqlite3", record_failures=1)
    runner = await _start(tmp_path, store, lines, running)
    rec = await _submit(runner, 5)
    await runner.wait_ended(rec.id)
    done = await store.get_batch("t", rec.id)
    assert done is not None
    assert (done.status, done.completed) == (BatchStatus.COMPLETED, 5)
    assert [x["custom_id"] for x in _lines(runner, done.output_file_id)] == [f"c{i}" for i in range(5)]
    assert len(lines.runs) == 6  # the line whose answer could not be written ran twice


async def test_a_full_disk_while_finalizing_is_tried_again(
    tmp_path: Path, running: list[BatchRunner]
) -> None:
    store = FlakyStore(tmp_path / "b.sqlite3", finish_failures=1)
    runner = await _start(tmp_path, store, Lines(), running)
    rec = await _submit(runner, 3)
    await store.failed.wait()
    while runner.metrics.finalize_failures._value.get() < 1:  # the runner has scheduled its retry
        await asyncio.sleep(0)
    now = await store.get_batch("t", rec.id)
    assert now is not None
    assert now.status is BatchStatus.FINALIZING  # not lost, not failed
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == ["file-in"]  # half-done outputs removed
    clock = runner.wall
    assert isinstance(clock, Clock)
    clock.t += FINALIZE_RETRY_S + 1
    runner.poke()
    await runner.wait_ended(rec.id)
    done = await store.get_batch("t", rec.id)
    assert done is not None
    assert (done.status, done.completed) == (BatchStatus.COMPLETED, 3)
    assert len(_lines(runner, done.output_file_id)) == 3


async def test_a_new_runner_resumes_what_the_last_one_left(
    tmp_path: Path, running: list[BatchRunner]
) -> None:
    gate = asyncio.Event()

    class Slow(Lines):
        async def run(self, line: LineRequest) -> LineAnswer:
            if orjson.loads(line.body)["messages"][0]["content"] not in ("p0", "p1"):
                await gate.wait()
            return await super().run(line)

    first_lines = Slow()
    first = await _start(tmp_path, SqliteBatchStore(tmp_path / "b.sqlite3"), first_lines, running)
    rec = await _submit(first, 6)
    while len(first_lines.runs) < 2 or first.progress()[0][0].completed < 2:
        await asyncio.sleep(0)
    await first.close()
    running.remove(first)
    second_lines = Lines()
    second = await _start(tmp_path, SqliteBatchStore(tmp_path / "b.sqlite3"), second_lines, running)
    await second.wait_ended(rec.id)
    done = await second.store.get_batch("t", rec.id)
    assert done is not None
    assert (done.status, done.completed) == (BatchStatus.COMPLETED, 6)
    assert sorted(second_lines.runs) == ["p2", "p3", "p4", "p5"]  # the answered ones did not run again
    assert [x["custom_id"] for x in _lines(second, done.output_file_id)] == [f"c{i}" for i in range(6)]


class ScriptedStore(SqliteBatchStore):
    def __init__(self, path: Path, failures: dict[int, int]) -> None:
        super().__init__(path)
        self.failures = dict(failures)

    async def record_result(self, batch_id: str, result: LineResult) -> BatchRecord | None:
        if self.failures.get(result.line, 0) > 0:
            self.failures[result.line] -= 1
            raise OSError(28, "No space left on device")
        return await super().record_result(batch_id, result)


@settings(max_examples=6, deadline=None)  # each example fsyncs its files: ~0.4 s
@given(
    outcomes=st.lists(st.tuples(st.booleans(), st.integers(0, 2)), min_size=1, max_size=12),
    in_flight=st.integers(1, 4),
)
def test_every_line_is_answered_exactly_once(
    tmp_path_factory: pytest.TempPathFactory, outcomes: list[tuple[bool, int]], in_flight: int
) -> None:
    """Whatever lines the engine refuses and whichever answers the store fails to write (it fails a
    line's first 0-2 answers), every custom_id appears once in the output or the error file."""

    async def run() -> None:
        root = tmp_path_factory.mktemp("r")
        refuse = frozenset(f"p{i}" for i, (ok, _) in enumerate(outcomes) if not ok)
        store = ScriptedStore(root / "b.sqlite3", {i + 1: fails for i, (_, fails) in enumerate(outcomes)})
        lines = Lines(refuse)
        runner = BatchRunner(
            store, BatchSettings(dir=root, max_lines_in_flight=in_flight), lines, BatchMetrics(), wall=Clock()
        )
        try:
            await runner.ensure_open()
            runner._tasks.spawn("feeder", runner.run)
            rec = await _submit(runner, len(outcomes))
            await runner.wait_ended(rec.id)
            done = await store.get_batch("t", rec.id)
            assert done is not None
            assert (done.completed, done.failed) == (len(outcomes) - len(refuse), len(refuse))
            out = _lines(runner, done.output_file_id) if done.output_file_id else []
            err = _lines(runner, done.error_file_id) if done.error_file_id else []
            assert sorted(x["custom_id"] for x in out + err) == sorted(f"c{i}" for i in range(len(outcomes)))
            assert {x["custom_id"] for x in err} == {f"c{p[1:]}" for p in refuse}
            assert len(lines.runs) == len(outcomes) + sum(f for _, f in outcomes)
        finally:
            await runner.close()

    asyncio.run(run())
