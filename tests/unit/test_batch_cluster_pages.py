"""Cluster mode's pieces of the Files and Batches API, without a network: the replica tag in ids, the
stores' pages in (created_at, id) order, and lists merged from several replicas' pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.batch.model import BatchRecord, BatchStatus, FileRecord, new_id, replica_tag, tag_of
from gateway.batch.sqlite_store import SqliteBatchStore
from gateway.front.batch_lists import merge


@given(st.text(min_size=1, max_size=40), st.sampled_from(["batch_", "file-"]))
def test_an_id_names_the_replica_that_made_it(name: str, prefix: str) -> None:
    tag = replica_tag(name)
    assert len(tag) == 8
    assert tag_of(new_id(prefix, tag)) == tag
    assert tag_of(new_id(prefix)) == ""  # made without a tag (one gateway): held where it is asked


@pytest.mark.parametrize(
    "object_id", ["batch_", "file-xyz", "batch_" + "g" * 32, "other_" + "0" * 32, "batch_req_" + "0" * 32]
)
def test_ids_that_are_not_tagged_have_no_tag(object_id: str) -> None:
    assert tag_of(object_id) == ""


def _batch(bid: str, created_at: int, owner: str = "a") -> BatchRecord:
    return BatchRecord(
        id=bid,
        owner=owner,
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        window_s=86400,
        status=BatchStatus.VALIDATING,
        created_at=created_at,
        expires_at=created_at + 86400,
    )


@pytest.fixture
async def store(tmp_path: Path) -> SqliteBatchStore:
    s = SqliteBatchStore(tmp_path / "b.sqlite3")
    await s.open()
    return s


async def test_pages_follow_created_at_then_id(store: SqliteBatchStore) -> None:
    # Inserted out of order: the page order is the records' (created_at, id), not the insertion order.
    for bid, t in [("b3", 20), ("b1", 10), ("b4", 20), ("b2", 10), ("b0", 5)]:
        await store.add_batch(_batch(bid, t))
        await store.add_file(
            FileRecord(id=f"f{bid}", owner="a", purpose="batch", filename="x", bytes=1, created_at=t)
        )
    await store.add_batch(_batch("other", 30, owner="b"))
    page, more = await store.page_batches("a", key=None, limit=2)
    assert ([b.id for b in page], more) == (["b4", "b3"], True)
    page, more = await store.page_batches("a", key=(20, "b3"), limit=5)
    assert ([b.id for b in page], more) == (["b2", "b1", "b0"], False)
    files, more = await store.page_files("a", purpose=None, key=(10, "fb1"), limit=2, ascending=True)
    assert ([f.id for f in files], more) == (["fb2", "fb3"], True)
    files, _ = await store.page_files("a", purpose="batch_output", key=None, limit=5, ascending=True)
    assert files == []


def _doc(i: str, t: int) -> dict[str, Any]:
    return {"id": i, "created_at": t}


pages_st = st.lists(
    st.lists(st.tuples(st.integers(0, 5), st.text("abc", min_size=1, max_size=3)), max_size=6), max_size=4
)


@given(pages_st, st.integers(1, 8), st.booleans())
def test_merge_keeps_the_order_and_the_limit(raw: list[list[tuple[int, str]]], limit: int, asc: bool) -> None:
    # Each replica's page in order, ids unique across replicas (as tags make them).
    pages = [sorted({(t, f"{r}{i}") for t, i in page}, reverse=not asc) for r, page in enumerate(raw)]
    docs = [[_doc(i, t) for t, i in p] for p in pages]
    merged, more = merge(docs, limit, ascending=asc)
    every = sorted((k for p in pages for k in p), reverse=not asc)
    assert [(d["created_at"], d["id"]) for d in merged] == every[:limit]
    assert more == (len(every) > limit)
    assert msgspec.json.decode(msgspec.json.encode(merged)) == merged
