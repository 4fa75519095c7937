"""The SQLite batch store: scoping by owner, pages, answers recorded at most once, export in line order."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.batch.model import BatchRecord, BatchStatus, FileRecord, InputLine, LineResult
from gateway.batch.sqlite_store import SqliteBatchStore


def _batch(bid: str, owner: str = "a", total: int = 0) -> BatchRecord:
    return BatchRecord(
        id=bid,
        owner=owner,
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        window_s=86400,
        status=BatchStatus.VALIDATING,
        created_at=1,
        expires_at=86401,
        total=total,
    )


def _file(fid: str, owner: str = "a", expires_at: int | None = None) -> FileRecord:
    return FileRecord(
        id=fid, owner=owner, purpose="batch", filename="x.jsonl", bytes=1, created_at=1, expires_at=expires_at
    )


@pytest.fixture
async def store(tmp_path: Path) -> SqliteBatchStore:
    s = SqliteBatchStore(tmp_path / "b.sqlite3")
    await s.open()
    return s


async def test_owner_scoping_and_pages(store: SqliteBatchStore) -> None:
    for i in range(5):
        await store.add_file(_file(f"f{i}"))
        await store.add_batch(_batch(f"b{i}"))
    await store.add_file(_file("other", owner="b"))
    assert await store.get_file("b", "f0") is None
    assert await store.get_file("a", "other") is None
    assert (await store.get_file(None, "other")) == _file("other", owner="b")
    page, more = await store.list_files("a", purpose=None, after=None, limit=2, ascending=False)
    assert ([f.id for f in page], more) == (["f4", "f3"], True)
    page, more = await store.list_files("a", purpose=None, after="f3", limit=5, ascending=False)
    assert ([f.id for f in page], more) == (["f2", "f1", "f0"], False)
    page, _ = await store.list_files("a", purpose=None, after="f1", limit=5, ascending=True)
    assert [f.id for f in page] == ["f2", "f3", "f4"]
    batches, more = await store.list_batches("a", after="b2", limit=1)
    assert ([b.id for b in batches], more) == (["b1"], True)
    assert (await store.list_batches("b", after=None, limit=10)) == ([], False)
    assert await store.delete_file("b", "f0") is None
    assert await store.delete_file("a", "f0") is not None
    assert await store.get_file("a", "f0") is None
    await store.close()


async def test_expired_files_spare_the_inputs_of_unfinished_batches(store: SqliteBatchStore) -> None:
    await store.add_file(_file("file-1", expires_at=10))  # the input of the batch below
    await store.add_file(_file("old", expires_at=10))
    await store.add_file(_file("new", expires_at=100))
    await store.add_batch(_batch("b"))
    assert [f.id for f in await store.expired_files(50)] == ["old"]
    await store.put_batch(msgspec.structs.replace(_batch("b"), status=BatchStatus.COMPLETED))
    assert sorted(f.id for f in await store.expired_files(50)) == ["file-1", "old"]
    await store.close()


async def test_a_status_change_keeps_the_counts_recorded_meanwhile(store: SqliteBatchStore) -> None:
    rec = msgspec.structs.replace(_batch("b", total=2), status=BatchStatus.IN_PROGRESS)
    await store.add_batch(_batch("b"))
    await store.start_batch(rec, [InputLine(1, "x", 0, 1), InputLine(2, "y", 1, 1)])
    await store.record_result("b", LineResult(line=1, ok=True, document=b"{}", output_tokens=3))
    await store.put_batch(
        msgspec.structs.replace(rec, status=BatchStatus.CANCELLING)
    )  # read before the answer
    got = await store.get_batch("a", "b")
    assert got is not None
    assert (got.status, got.completed, got.output_tokens) == (BatchStatus.CANCELLING, 1, 3)
    assert [x.line for x in await store.pending("b", 0, 10)] == [2]
    await store.close()


@settings(max_examples=15, deadline=None)
@given(
    total=st.integers(1, 40),
    answers=st.lists(st.tuples(st.integers(1, 40), st.booleans()), max_size=80),
)
def test_each_line_is_answered_at_most_once(
    tmp_path_factory: pytest.TempPathFactory, total: int, answers: list[tuple[int, bool]]
) -> None:
    import asyncio

    async def run() -> None:
        store = SqliteBatchStore(tmp_path_factory.mktemp("s") / "b.sqlite3")
        await store.open()
        rec = msgspec.structs.replace(_batch("b", total=total), status=BatchStatus.IN_PROGRESS)
        await store.add_batch(_batch("b"))
        await store.start_batch(rec, [InputLine(i, f"c{i}", 0, 1) for i in range(1, total + 1)])
        first: dict[int, bool] = {}
        for line, ok in answers:
            if line > total:
                continue
            counted = await store.record_result("b", LineResult(line=line, ok=ok, document=b"%d" % line))
            assert (counted is not None) == (line not in first)
            first.setdefault(line, ok)
        got = await store.get_batch(None, "b")
        assert got is not None
        assert got.completed == sum(first.values())
        assert got.failed == len(first) - sum(first.values())
        written: list[int] = []
        left: list[int] = []
        await store.export("b", lambda r: written.append(r.line), lambda x: left.append(x.line))
        assert written == sorted(first)
        assert left == [i for i in range(1, total + 1) if i not in first]
        await store.finish_batch(msgspec.structs.replace(got, status=BatchStatus.COMPLETED), [])
        assert await store.pending("b", 0, 100) == []
        await store.close()

    asyncio.run(run())
