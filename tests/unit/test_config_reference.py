"""docs/config-reference.md is generated from the gateway.toml schema: a key cannot be added (or renamed,
or its default changed) without the reference following, and every key has a description."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gateway.config.reference import Key, example_comments, field_comments, keys, render

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def test_the_reference_is_the_generators_output() -> None:
    assert REFERENCE.read_text() == render(list(keys())), (
        "docs/config-reference.md is stale: python -m gateway.config.reference > docs/config-reference.md"
    )


def test_every_key_has_a_description() -> None:
    missing = [f"{k.table} {k.name}" for k in keys() if not k.description]
    assert missing == [], "describe these keys in the schema (a comment on the field) or conf/gateway.toml"


def test_every_table_of_the_schema_is_covered() -> None:
    tables = {k.table for k in keys()}
    for table in ("[server]", "[limits]", "[upstream]", "[telemetry.prior]", "[[endpoints]]", "[[tenants]]"):
        assert table in tables
    assert "[lifecycle.evictor]" in tables
    assert "[[nodes]]" in tables
    # a renamed key appears under the name a file uses
    assert any(k.table == "[[endpoints]]" and k.name == "class" for k in keys())


class _Demo(msgspec.Struct, frozen=True, kw_only=True):
    plain: int = 1  # said on its line
    # said above it,
    # over two lines
    above: str = "x"
    bare: bool = False


def test_a_fields_description_comes_from_its_line_or_the_lines_above() -> None:
    assert field_comments(_Demo) == {"plain": "said on its line", "above": "said above it, over two lines"}


def test_an_undescribed_field_takes_the_examples_comment_or_stays_empty(tmp_path: Path) -> None:
    example = tmp_path / "gateway.toml"
    example.write_text("[demo]\n# bare = true   # said in the example\n")
    comments = example_comments(example)
    assert comments == {("[demo]", "bare"): "said in the example"}

    class Root(msgspec.Struct, kw_only=True):
        demo: _Demo = _Demo()

    got = {k.name: k for k in keys(Root, {("[demo]", "bare"): "said in the example"})}
    assert got["bare"] == Key("[demo]", "bare", "boolean", "`false`", "said in the example")
    assert got["plain"].default == "`1`"
    assert got["plain"].type == "integer"
    assert [k.name for k in keys(Root, {}) if not k.description] == ["bare"]


@pytest.mark.parametrize("text", ["| `listen` | string |", "## `[[endpoints]]`", "| `class` |"])
def test_the_reference_reads_as_tables(text: str) -> None:
    assert text in REFERENCE.read_text()
