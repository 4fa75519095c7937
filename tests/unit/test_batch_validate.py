"""Input files checked line by line, and completion windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.batch.validate import MAX_ERRORS, scan, window_seconds

CHAT = "/v1/chat/completions"


def _ok(endpoint: str, body: dict[str, Any]) -> tuple[str, str, str | None] | None:
    return None if body.get("model") == "m" else ("model_not_found", "unknown model", "model")


def _line(cid: str, **over: Any) -> bytes:
    x = {"custom_id": cid, "method": "POST", "url": CHAT, "body": {"model": "m"}, **over}
    return orjson.dumps(x) + b"\n"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("24h", 86400.0), ("90s", 90.0), ("30m", 1800.0), ("2d", 172800.0), (" 1.5h ", 5400.0)],
)
def test_windows(text: str, seconds: float) -> None:
    assert window_seconds(text, 30 * 86400) == seconds


@pytest.mark.parametrize("text", ["", "24", "h", "-1h", "0s", "31d", "1w", 24, None])
def test_bad_windows(text: object) -> None:
    with pytest.raises(ValueError, match=r"duration|at most|more than"):
        window_seconds(text, 30 * 86400)


def test_offsets_point_at_each_line_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    p = tmp_path / "in.jsonl"
    data = _line("a") + b"\n" + _line("b") + b"   \n" + _line("c")
    p.write_bytes(data)
    found = scan(p, CHAT, 10, _ok)
    assert found.errors == []
    assert [(x.line, x.custom_id) for x in found.lines] == [(1, "a"), (2, "b"), (3, "c")]
    for x in found.lines:
        assert orjson.loads(data[x.offset : x.offset + x.length])["custom_id"] == x.custom_id
    assert found.model == "m"


def test_every_problem_with_its_line(tmp_path: Path) -> None:
    p = tmp_path / "in.jsonl"
    p.write_bytes(
        _line("a")
        + _line("a")  # 2: duplicate
        + b"[1]\n"  # 3: not an object
        + _line("d", url="/v1/embeddings")  # 4
        + _line("e", body={"model": "x"})  # 5: unknown model
        + _line("", method="POST")  # 6: empty custom_id
        + b'{"custom_id": "g", \n'  # 7: bad JSON
    )
    found = scan(p, CHAT, 10, _ok)
    assert [(e.line, e.code) for e in found.errors] == [
        (2, "duplicate_custom_id"),
        (3, "invalid_json_line"),
        (4, "invalid_url"),
        (5, "model_not_found"),
        (6, "missing_required_parameter"),
        (7, "invalid_json_line"),
    ]
    assert found.errors[3].param == "body.model"
    assert "line 1" in found.errors[0].message


def test_limits(tmp_path: Path) -> None:
    p = tmp_path / "in.jsonl"
    p.write_bytes(b"")
    assert [e.code for e in scan(p, CHAT, 10, _ok).errors] == ["empty_file"]
    p.write_bytes(b"".join(_line(str(i)) for i in range(5)))
    found = scan(p, CHAT, 4, _ok)
    assert (found.errors[0].code, found.errors[0].line) == ("too_many_requests", 5)
    p.write_bytes(b"x\n" * (MAX_ERRORS + 50))
    assert len(scan(p, CHAT, 1000, _ok).errors) == MAX_ERRORS
