"""Strict TOML decoding: text -> raw tables -> frozen msgspec Structs; errors name the file and key path.

msgspec reports where a value went wrong as "... - at `$.endpoints[1]`" and names a dict entry only as
`[...]`. `convert()` turns that into our key path (`endpoints[1].foo`, `aliases.gpt-4o`), finds which
dict entry failed, and rewords the message in TOML terms (table, string, integer), listing the known
keys of a table or the allowed values of an enum.
"""

from __future__ import annotations

import copy
import enum
import json
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Generic, Literal, TypeVar, Union, get_args, get_origin

import msgspec
import msgspec.structs
import msgspec.toml
from msgspec import Meta

from gateway.core.errors import ConfigError

T = TypeVar("T")

#: One step of a key path: a table key or an array index.
Segment = str | int
#: msgspec's path may also say `[...]`: "some entry of this dict" (resolved by `_locate`).
_RawSegment = str | int | types.EllipsisType

#: `convert_all` stops after this many problems (a file of garbage is not worth more).
MAX_PROBLEMS: Final = 100
#: `_stand_in`'s answer for a type it has no value for.
_NO_VALUE: Final = object()

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
    segments, message = _problem(e, tp, raw, extra_choices or {})
    return ConfigError(message, path=join_path(prefix, segments))


@dataclass(frozen=True, slots=True)
class Decoded(Generic[T]):
    """What `convert_all` made of a file: every decode problem, and the value decoded from the rest."""

    value: T | None  # None: the bad values could not be set aside
    problems: list[ConfigError]
    repaired: frozenset[str]  # key paths whose value was dropped or replaced by a stand-in

    def untouched(self, e: ConfigError) -> bool:
        """`e` (a later check's problem) is not about a value the decode set aside: a check of a stand-in
        would only repeat, in other words, a problem already reported."""
        return not any(e.path == p or e.path.startswith((f"{p}.", f"{p}[")) for p in self.repaired)


def convert_all(
    raw: dict[str, Any],
    tp: type[T],
    *,
    label: str,
    extra_choices: Mapping[type, tuple[str, ...]] | None = None,
) -> Decoded[T]:
    """Like `convert`, but every problem rather than the first (up to MAX_PROBLEMS).

    Each time the strict decode fails, its problem is recorded and the bad value set aside: an unknown
    key, or a bad value whose key has a default, is dropped; a bad array item or a bad or missing
    required key gets a stand-in of its declared type (so array indices keep their meaning). Then the
    decode runs again. The first problem is `convert`'s. The value decoded at the end lets the
    cross-reference checks run too; `Decoded.untouched` tells which of their problems still mean
    something.
    """
    work = copy.deepcopy(raw)
    choices = extra_choices or {}
    problems: list[ConfigError] = []
    repaired: set[str] = set()
    while len(problems) < MAX_PROBLEMS:
        try:
            value = msgspec.convert(work, tp, strict=True)
        except msgspec.ValidationError as e:
            segments, message = _problem(e, tp, work, choices)
            path = join_path("", segments)
            problems.append(ConfigError(message, path=path, file=label))
            if path in repaired or not _set_aside(
                work, tp, segments, unknown=_UNKNOWN.match(message) is not None
            ):
                break  # a stand-in that does not decode either, or nothing to set aside: stop here
            repaired.add(path)
            continue
        return Decoded(value, problems, frozenset(repaired))
    return Decoded(None, problems, frozenset(repaired))


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


def _problem(
    e: msgspec.ValidationError, tp: Any, raw: Any, extra_choices: Mapping[type, tuple[str, ...]]
) -> tuple[list[Segment], str]:
    """Where `e` went wrong (a key path; for an unknown or missing key, ending in that key) and why."""
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
        choices = _choices(type_at(tp, segments), extra_choices)
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
    return segments, message


def _set_aside(work: dict[str, Any], tp: Any, segments: list[Segment], *, unknown: bool) -> bool:
    """Drop the value at `segments` from `work`, or put a stand-in there; False when neither can be done."""
    if not segments:
        return False
    parent: Any = work
    for seg in segments[:-1]:
        parent = _child_raw(parent, seg)
    key = segments[-1]
    if isinstance(parent, dict) and isinstance(key, str):
        if unknown or not _required(type_at(tp, segments[:-1]), key):
            parent.pop(key, None)
            return True
    elif not (isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent)):
        return False
    stand_in = _stand_in(type_at(tp, segments))
    if stand_in is _NO_VALUE:
        return False
    parent[key] = stand_in
    return True


def _required(tp: Any, key: str) -> bool:
    """Key `key` of a table of type `tp` must be given (a Struct field without a default)."""
    for t in _variants(tp):
        if _is_struct(t):
            return any(f.encode_name == key and f.required for f in msgspec.structs.fields(t))
    return False


def _stand_in(tp: Any) -> Any:
    """A value that decodes as `tp`, to stand in for a bad or missing one; _NO_VALUE when none is known."""
    metas: list[Meta] = []
    while get_origin(tp) is Annotated:
        tp, *extra = get_args(tp)
        metas += [m for m in extra if isinstance(m, Meta)]
    origin = get_origin(tp)
    if tp is Any:
        return None
    if origin in (Union, types.UnionType):
        members = get_args(tp)
        return None if type(None) in members else _stand_in(members[0])
    if _is_struct(tp):
        table = {f.encode_name: _stand_in(f.type) for f in msgspec.structs.fields(tp) if f.required}
        return _NO_VALUE if _NO_VALUE in table.values() else table
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        return []
    if origin is dict or tp is dict:
        return {}
    if origin is Literal:
        return get_args(tp)[0]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return next(iter(tp)).value
    if tp is bool:
        return False
    if tp is str:
        return ""
    if tp in (int, float):
        value: float = 0
        for m in metas:
            if m.ge is not None:
                value = max(value, m.ge)
            if m.gt is not None:
                value = max(value, m.gt + 1)
        for m in metas:
            if m.le is not None:
                value = min(value, m.le)
        return int(value) if tp is int else float(value)
    return _NO_VALUE


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
