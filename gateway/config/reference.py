"""The configuration reference of gateway.toml, generated from its schema (`GatewayFile`).

Every key of every table comes from the msgspec Structs themselves (name, type, range, default); its
description is the schema's own comment on the field (the comment at the end of its line, or the
comment lines right above it), else the comment beside the key in the commented example
`conf/gateway.toml`. `docs/config-reference.md` is this module's output; a test regenerates it and
fails when the file differs or when a key has no description anywhere, so a key cannot be added
without its documentation.

    python -m gateway.config.reference > docs/config-reference.md
"""

from __future__ import annotations

import inspect
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
from msgspec import inspect as mi

from gateway.config.schema import GatewayFile

EXAMPLE: Final = Path(__file__).resolve().parents[2] / "conf" / "gateway.toml"


@dataclass(frozen=True, slots=True)
class Key:
    table: str  # "[server]", "[[endpoints]]", "" for top-level keys
    name: str
    type: str
    default: str
    description: str


def field_comments(cls: type) -> dict[str, str]:
    """The comment of each field of a Struct's class body: at the end of its line, else the comment
    lines right above it."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[str, str] = {}
    field = re.compile(r"^    ([a-z_][a-z0-9_]*)\s*:")
    for i, line in enumerate(lines, start=1):
        m = field.match(line)
        if m is None:
            continue
        text = comments.get(i, "")
        if not text:
            above: list[str] = []
            j = i - 1
            while j >= 1 and lines[j - 1].strip().startswith("#"):
                above.insert(0, comments.get(j, ""))
                j -= 1
            text = " ".join(a for a in above if a)
        if text:
            out[m.group(1)] = text
    return out


def example_comments(path: Path = EXAMPLE) -> dict[tuple[str, str], str]:
    """(table, key) -> the comment beside the key in the commented example gateway.toml, whether the
    key is set or commented out there."""
    out: dict[tuple[str, str], str] = {}
    table = ""
    header = re.compile(r"^#?\s*(\[\[?[a-z_.]+\]\]?)\s*(#.*)?$")
    key = re.compile(r"^#?\s*([a-z_][a-z0-9_]*)\s*=\s*.*?#\s*(.+)$")
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if (h := header.match(line)) is not None:
            table = h.group(1)
            continue
        if (k := key.match(line)) is not None:
            out.setdefault((table, k.group(1)), k.group(2).strip())
    return out


def _type_name(t: mi.Type) -> str:
    match t:
        case mi.IntType():
            return "integer" + _bounds(t)
        case mi.FloatType():
            return "number" + _bounds(t)
        case mi.StrType():
            return "string"
        case mi.BoolType():
            return "boolean"
        case mi.LiteralType():
            return " \\| ".join(f'`"{v}"`' if isinstance(v, str) else f"`{v}`" for v in t.values)
        case mi.EnumType():
            return " \\| ".join(f'`"{m.value}"`' for m in t.cls)
        case mi.UnionType():
            parts = [_type_name(x) for x in t.types if not isinstance(x, mi.NoneType)]
            return " or ".join(parts) + (" (optional)" if len(parts) < len(t.types) else "")
        case mi.VarTupleType() | mi.ListType():
            return f"array of {_type_name(t.item_type)}"
        case mi.DictType():
            return f"table of {_type_name(t.value_type)}"
        case mi.StructType():
            return "table"
        case mi.AnyType():
            return "any"
    return type(t).__name__


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    parts = []
    for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
        v = getattr(t, attr, None)
        if v is not None:
            parts.append(f"{sign} {v:g}")
    return f" ({', '.join(parts)})" if parts else ""


def _default(f: mi.Field) -> str:
    if f.required:
        return "required"
    value: Any = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
    if value is None:
        return "none"
    if isinstance(value, msgspec.Struct):
        return "see the table"
    if isinstance(value, str):
        return f'`"{value}"`' if value else '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list | dict) and not value:
        return "`[]`" if not isinstance(value, dict) else "`{}`"
    if hasattr(value, "value"):  # an enum
        return f'`"{value.value}"`'
    return f"`{value}`"


def _struct_of(t: mi.Type) -> tuple[mi.StructType, bool] | None:
    """The Struct a field holds (and whether it is an array of them), if any."""
    if isinstance(t, mi.UnionType):
        for x in t.types:
            if (found := _struct_of(x)) is not None:
                return found
        return None
    if isinstance(t, mi.StructType):
        return t, False
    if isinstance(t, mi.VarTupleType | mi.ListType) and isinstance(t.item_type, mi.StructType):
        return t.item_type, True
    return None


def keys(
    root: type[msgspec.Struct] = GatewayFile, example: dict[tuple[str, str], str] | None = None
) -> Iterator[Key]:
    """Every key of `root`, table by table, in schema order."""
    example = example_comments() if example is None else example

    def walk(st: mi.StructType, table: str, path: str) -> Iterator[Key]:
        own = field_comments(st.cls)
        nested: list[tuple[mi.StructType, str, str]] = []
        for f in st.fields:
            inner = _struct_of(f.type)
            if inner is not None:
                sub, many = inner
                name = f"{path}.{f.encode_name}" if path else f.encode_name
                nested.append((sub, f"[[{name}]]" if many else f"[{name}]", name))
                continue
            text = own.get(f.name) or example.get((table, f.encode_name), "")
            yield Key(table, f.encode_name, _type_name(f.type), _default(f), text)
        for sub, sub_table, sub_path in nested:
            yield from walk(sub, sub_table, sub_path)

    info = mi.type_info(root)
    assert isinstance(info, mi.StructType)
    yield from walk(info, "", "")


def render(all_keys: list[Key]) -> str:
    out = [
        "# Configuration reference: gateway.toml",
        "",
        "Generated from the schema (`gateway/config/schema.py`) by `python -m gateway.config.reference`;",
        "a test keeps this file equal to its output. `conf/gateway.toml` is a commented example;",
        "`berth check -c FILE` validates a file and names every problem by key path. Unknown keys are",
        'errors. Which tables reload on SIGHUP: [operating.md](operating.md), "Policies and reload" in',
        "[policies.md](policies.md).",
    ]
    table = None
    for k in all_keys:
        if k.table != table:
            table = k.table
            out += ["", f"## `{table}`" if table else "## Top level", "", "| key | type | default | what |"]
            out.append("| --- | --- | --- | --- |")
        desc = k.description.replace("|", "\\|")
        out.append(f"| `{k.name}` | {k.type} | {k.default} | {desc} |")
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(render(list(keys())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
