"""The gc-census diagnostic (`berth-loadgen diag gc-census`): the hook's census of a young collection in
this process, the summary of a run's records, and the wrapper interpreter that puts only berth under
the hook."""

from __future__ import annotations

import gc
import io
import subprocess
from pathlib import Path
from typing import Any

import orjson

from loadgen.diag import gc_census
from loadgen.diag.gc_census_hook import LARGE_REFS, YoungCensus, holders


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_the_hook_counts_a_young_collections_objects_garbage_and_survivors() -> None:
    out = io.BytesIO()
    hook = YoungCensus(out)
    gc.collect()
    kept = [Node() for _ in range(50)]
    big = [Node() for _ in range(LARGE_REFS)]  # a container of many references
    for _ in range(20):  # cycles, dropped: garbage for the collection
        a, b = Node(), Node()
        a.other, b.other = b, a
    del a, b
    gc.callbacks.insert(0, hook)
    try:
        gc.collect(0)
    finally:
        gc.callbacks.remove(hook)
    recs = [orjson.loads(line) for line in out.getvalue().splitlines()]
    rec = next(r for r in recs if r["generation"] == 0)
    types = dict(rec["types"])
    assert types["Node"] >= len(kept) + len(big) + 40
    assert rec["collected"] >= 40  # the 20 pairs (their dicts too)
    assert dict(rec["survivor_types"])["Node"] >= len(kept) + len(big)
    assert [LARGE_REFS, "list", "Node"] in rec["largest"]
    assert rec["ms"] >= 0.0
    assert rec["cpu_ms"] >= 0.0


def _young(at: float, objects: int, frozen: int, types: dict[str, int]) -> dict[str, Any]:
    return {
        "generation": 0, "at": at, "objects": objects, "references": 3 * objects, "frozen": frozen,
        "types": list(types.items()), "refs_by_type": [(k, 3 * v) for k, v in types.items()],
        "largest": [[500, "list", "int"]], "ms": objects / 1000, "cpu_ms": objects / 2000, "collected": 0,
        "survivors": objects // 2, "survivor_types": [(k, v // 2) for k, v in types.items()],
    }  # fmt: skip


def test_the_summary_starts_at_the_settled_schedule_and_averages_by_type(tmp_path: Path) -> None:
    recs = [
        _young(1.0, 90_000, 0, {"tuple": 90_000}),  # startup: before the schedule settled
        {"generation": 2, "at": 2.0, "ms": 300.0, "cpu_ms": 200.0, "collected": 5},
        _young(3.0, 2_000, 100_000, {"tuple": 1_000, "coroutine": 1_000}),
        _young(4.0, 4_000, 100_000, {"tuple": 3_000, "coroutine": 1_000}),
    ]
    census = tmp_path / "census.jsonl"
    census.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    loaded = gc_census.load(census)
    assert len(loaded) == 2  # the full collection before the settled census is startup's too
    doc = gc_census.summarize(loaded, top=5)
    assert [y["objects"] for y in doc["young"]] == [2_000, 4_000]
    assert doc["young_objects"] == {"median": 3_000, "max": 4_000}
    by_type = {t["type"]: t for t in doc["types"]}
    assert by_type["tuple"] == {"type": "tuple", "objects": 2_000, "references": 6_000, "survivors": 1_000}
    assert doc["largest"] == [{"type": "list", "holding": "int", "references": 500}]
    assert doc["older"] == []
    assert doc["full_growth"] == []


def test_the_growth_between_full_collections_counts_only_the_schedules_whole_ones() -> None:
    def full(at: float, frozen: int, types: dict[str, int]) -> dict[str, Any]:
        return {
            "generation": 2, "at": at, "frozen": frozen, "ms": 300.0, "collected": 0,
            "survivors": sum(types.values()), "survivor_types": list(types.items()),
        }  # fmt: skip

    recs = [
        _young(1.0, 2_000, 100_000, {"tuple": 2_000}),
        full(2.0, 0, {"SchedRequest": 2_600, "dict": 9_000}),
        full(3.0, 100_000, {"SchedRequest": 10}),  # CPython's own: the frozen objects not walked
        full(12.0, 0, {"SchedRequest": 6_700, "dict": 9_000, "_Task": 2_000}),
    ]
    growth = gc_census.summarize(recs, top=5)["full_growth"]
    assert growth == [
        {"type": "SchedRequest", "from": 2_600, "to": 6_700, "seconds": 10.0},
        {"type": "_Task", "from": 0, "to": 2_000, "seconds": 10.0},
    ]


def test_the_wrapper_puts_berth_alone_under_the_hook(tmp_path: Path) -> None:
    census = tmp_path / "census.jsonl"
    python = gc_census.wrapper(tmp_path / "python.sh", census)
    plain = subprocess.run([str(python), "-c", "print('plain')"], capture_output=True, text=True, check=True)
    assert plain.stdout == "plain\n"
    assert not census.exists()
    berth = subprocess.run(
        [str(python), "-m", "gateway.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert berth.returncode == 0, berth.stderr
    assert census.exists()  # opened by the hook, which then ran the CLI


class Held:
    pass


def test_holders_names_what_holds_the_oldest_objects_of_a_type_two_levels_up() -> None:
    keeper = {"x": Held()}
    box = [keeper]
    survivors: list[Any] = [keeper["x"], Held()]
    found = holders(survivors, frozenset({"Held"}), per_type=1)
    assert list(found) == ["Held"]
    (chain,) = found["Held"]  # the first one only: held by the dict, which the list holds
    assert any(c.startswith("dict <- ") and "list" in c for c in chain), chain
    assert box[0] is keeper
