"""Strict TOML decoding: text -> raw tables -> frozen msgspec Structs; errors name the file and key path.

msgspec reports where a value went wrong as "... - at `$.endpoints[1]`" and names a dict entry only as
`[...]`. `convert()` turns that into our key path (`endpoints[1].foo`, `aliases.gpt-4o`), finds which
dict entry failed, and rewords the message in TOML terms (table, string, integer), listing the known
keys of a table or the allowed values of an enum.
"""

from __future__ import annotations

import enum
import json
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec
import msgspec.structs
import msgspec.toml

from gateway.core.errors import ConfigError

T = TypeVar("T")

#: One step of a key path: a table key or an array index.
Segment = str | int
#: msgspec's path may also say `[...]`: "some entry of this dict" (resolved by `_locate`).
_RawSegment = str | int | types.EllipsisType

_AT = " - at `$"
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_SYNTAX_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(.*)`$")
_MISSING = re.compile(r"^Object missing required field `(.*)`$")
_ENUM = re.compile(r"^Invalid enum value (.*)$")
_EXPECTED = re.compile(r"^Expected `([^`]*)`(.*?)(?:, got `([^`]*)`)?$")

_TOML_NAMES: Mapping[str, str] = {
    "object": "table",
    "array": "array",
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
}


def read_toml(path: Path, label: str) -> dict[str, Any]:
    """The top-level table of the TOML file at `path`; errors are reported against `label`."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read file: {e.strerror or e}", file=label) from None
    return parse_toml(data, label)


def parse_toml(text: str | bytes, label: str) -> dict[str, Any]:
    """Parse TOML text; a syntax error is reported as `LABEL:LINE:COLUMN: TOML syntax error: ...`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"not valid UTF-8 (byte {e.start})", file=label) from None
    try:
        raw = msgspec.toml.decode(text)
    except msgspec.DecodeError as e:
        msg = str(e)
        where = ""
        m = _SYNTAX_AT.search(msg)
        if m is not None:
            where = f"{m.group(1)}:{m.group(2)}"
            msg = msg[: m.start()]
        if msg.startswith(("Cannot overwrite a value", "Cannot declare")):
            msg += " (a key or table is defined twice)"
        raise ConfigError(f"TOML syntax error: {_lower_first(msg)}", path=where, file=label) from None
    if not isinstance(raw, dict):  # pragma: no cover - a TOML document is always a table
        raise ConfigError("expected a TOML table", file=label)
    return raw


def convert(
    raw: Any,
    tp: type[T],
    *,
    label: str,
    prefix: str = "",
    extra_choices: Mapping[type, tuple[str, ...]] | None = None,
) -> T:
    """`raw` as a `tp`, strictly (no unknown keys, no lax type coercion).

    Errors name `label` and the key path under `prefix`. `extra_choices` adds accepted spellings to an
    enum's list of allowed values in messages (e.g. "auto", which the loader maps to None itself).
    """
    try:
        return msgspec.convert(raw, tp, strict=True)
    except msgspec.ValidationError as e:
        raise validation_error(e, tp, raw, prefix=prefix, extra_choices=extra_choices).within(
            file=label
        ) from None


def validation_error(
    e: msgspec.ValidationError,
    tp: Any,
    raw: Any,
    *,
    prefix: str = "",
    extra_choices: Mapping[type, tuple[str, ...]] | None = None,
) -> ConfigError:
    """msgspec's error for `raw` against `tp` as a ConfigError with our key path (no file yet)."""
    segments, msg = _locate(e, tp, raw)
    m = _UNKNOWN.match(msg)
    if m is not None:
        known = _struct_keys(type_at(tp, segments))
        segments = [*segments, m.group(1)]
        if known is None:
            message = "unknown key"
        elif not known:
            message = "unknown key (this table takes no keys)"
        else:
            message = f"unknown key (known: {', '.join(known)})"
    elif (m := _MISSING.match(msg)) is not None:
        segments = [*segments, m.group(1)]
        message = "missing required key"
    elif (m := _ENUM.match(msg)) is not None:
        choices = _choices(type_at(tp, segments), extra_choices or {})
        message = f"invalid value {m.group(1)}"
        if choices:
            message += f" (expected one of: {', '.join(choices)})"
    elif (m := _EXPECTED.match(msg)) is not None:
        expected, rest, got = m.groups()
        message = f"expected {_toml_type(expected, expected_side=True)}{rest}"
        if got:
            message += f", got {_toml_type(got, expected_side=False)}"
    else:
        message = _lower_first(msg)
    return ConfigError(message, path=join_path(prefix, segments))


def join_path(prefix: str, segments: list[Segment]) -> str:
    """`prefix` followed by `segments` in TOML key-path spelling: `a.b[2]."odd.key"`."""
    out = prefix
    for seg in segments:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            key = seg if _BARE_KEY.match(seg) else json.dumps(seg, ensure_ascii=False)
            out = f"{out}.{key}" if out else key
    return out


def type_at(tp: Any, segments: list[Segment]) -> Any:
    """The declared type at key path `segments` below `tp` (Any when it cannot be told)."""
    for seg in segments:
        tp = _child_type(tp, seg)
    return tp


# ----------------------------------------------------------------------------- internals


def _split(msg: str) -> tuple[str, list[_RawSegment]]:
    if _AT not in msg:
        return msg, []
    text, rest = msg.split(_AT, 1)
    rest = rest.removesuffix("`")
    segments: list[_RawSegment] = []
    for m in _SEGMENT.finditer(rest):
        key, index = m.groups()
        if key is not None:
            segments.append(key)
        elif index == "...":
            segments.append(...)
        else:
            segments.append(int(index))
    return text, segments


def _locate(e: msgspec.ValidationError, tp: Any, raw: Any) -> tuple[list[Segment], str]:
    """Key path and message of `e`; a `[...]` step is resolved to the dict key whose value failed."""
    msg, segments = _split(str(e))
    out: list[Segment] = []
    for seg in segments:
        if isinstance(seg, types.EllipsisType):
            value_type = _dict_value_type(tp)
            if isinstance(raw, dict) and value_type is not None:
                for key, value in raw.items():
                    try:
                        msgspec.convert(value, value_type, strict=True)
                    except msgspec.ValidationError as inner:
                        sub, sub_msg = _locate(inner, value_type, value)
                        return [*out, str(key), *sub], sub_msg
            return out, msg  # could not tell which entry: stop at the table
        out.append(seg)
        tp = _child_type(tp, seg)
        raw = _child_raw(raw, seg)
    return out, msg


def _variants(tp: Any) -> list[Any]:
    """`tp` without Annotated wrappers, a union split into its members, None dropped."""
    if get_origin(tp) is Annotated:
        return _variants(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        return [v for arg in get_args(tp) for v in _variants(arg)]
    return [] if tp is type(None) else [tp]


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _child_type(tp: Any, seg: Segment) -> Any:
    for t in _variants(tp):
        origin = get_origin(t)
        if isinstance(seg, str) and _is_struct(t):
            for f in msgspec.structs.fields(t):
                if f.encode_name == seg:
                    return f.type
        elif isinstance(seg, str) and origin is dict:
            return get_args(t)[1]
        elif isinstance(seg, int) and origin in (list, tuple, set, frozenset):
            return get_args(t)[0]
    return Any


def _dict_value_type(tp: Any) -> Any:
    for t in _variants(tp):
        if get_origin(t) is dict:
            return get_args(t)[1]
    return None


def _child_raw(raw: Any, seg: Segment) -> Any:
    if isinstance(seg, int) and isinstance(raw, list) and 0 <= seg < len(raw):
        return raw[seg]
    if isinstance(seg, str) and isinstance(raw, dict):
        return raw.get(seg)
    return None


def _struct_keys(tp: Any) -> list[str] | None:
    """The keys a table of type `tp` accepts; None when `tp` is not a Struct."""
    for t in _variants(tp):
        if _is_struct(t):
            return [f.encode_name for f in msgspec.structs.fields(t)]
    return None


def _choices(tp: Any, extra: Mapping[type, tuple[str, ...]]) -> list[str]:
    for t in _variants(tp):
        if isinstance(t, type) and issubclass(t, enum.Enum):
            return [*extra.get(t, ()), *(str(m.value) for m in t)]
        if get_origin(t) is Literal:
            return [str(a) for a in get_args(t)]
    return []


def _toml_type(spelling: str, *, expected_side: bool) -> str:
    names = [n.strip() for n in spelling.split("|") if n.strip() != "null"]
    if not expected_side:
        return " or ".join(n if n == "float" else _TOML_NAMES.get(n, n) for n in names)
    return " or ".join(_TOML_NAMES.get(n, n) for n in names)


def _lower_first(s: str) -> str:
    return s[:1].lower() + s[1:]
