"""`berth check`: every problem in one run, the kind of file checked, empty and unrecognisable files;
and the collecting decode under it (`convert_all`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.check import GATEWAY_KEYS, FileKind, check_file
from gateway.config.load import load_gateway_config
from gateway.config.policy_schema import PolicyFile
from gateway.config.schema import GatewayFile
from gateway.core.errors import ConfigError
from gateway.core.strict_toml import convert, convert_all

POLICY_OK = '[ordering]\nplugin = "fcfs"\n[placement]\npicker = { plugin = "max-score" }\n'

# Four decode problems and two cross-reference ones, in one file: one run reports all six.
GATEWAY_BAD = """\
bogus = 1
[server]
listen = "nope"
max_body_bytes = "big"
[limits]
max_queue_per_model = 0
[[endpoints]]
url = "ftp://a"
engine = "tgi"
[[endpoints]]
cap = 3
[[endpoints]]
url = "http://ok:1"
models = [1, "x"]
"""

POLICY_BAD = """\
[ordering]
plugin = "lifo"
extra = 1
[placement]
picker = { plugin = "nope" }
[[placement.scorers]]
plugin = "least-outstanding"
weight = -1
[slo]
default_class = "zzz"
[[slo.classes]]
name = "a b"
[[slo.classes]]
name = "chat"
ttft_ms = "x"
[[slo.rules]]
class = "nah"
path = "/v2"
"""


def _write(tmp_path: Path, text: str, name: str = "file.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_gateway_config_reports_every_decode_and_cross_reference_problem(tmp_path: Path) -> None:
    path = _write(tmp_path, GATEWAY_BAD)
    report = check_file(path)
    assert report.kind is FileKind.GATEWAY
    assert report.problems == [
        f"{path}:{line}"
        for line in (
            f"bogus: unknown key (known: {', '.join(GATEWAY_KEYS)})",
            "server.max_body_bytes: expected integer, got string",
            "limits.max_queue_per_model: expected integer >= 1",
            "endpoints[0].engine: invalid value 'tgi' (expected one of: auto, vllm, sglang)",
            "endpoints[1].url: missing required key",
            "endpoints[2].models[0]: expected string, got integer",
            "server.listen: expected HOST:PORT, got 'nope'",
            "endpoints[0].url: expected an http:// or https:// URL, got 'ftp://a'",
        )
    ]
    assert report.summary(path) == (f"{path}: 8 problems (gateway config; the packaged default policy)")


def test_the_first_problem_is_the_one_serve_reports(tmp_path: Path) -> None:
    path = _write(tmp_path, GATEWAY_BAD)
    with pytest.raises(ConfigError) as info:
        load_gateway_config(path, env={})
    assert check_file(path).problems[0] == str(info.value)


def test_a_policy_file_reports_every_problem(tmp_path: Path) -> None:
    path = _write(tmp_path, POLICY_BAD)
    report = check_file(path)
    assert report.kind is FileKind.POLICY
    assert report.problems == [
        f"{path}:{line}"
        for line in (
            "ordering.extra: unknown key (known: plugin, params)",
            "placement.scorers[0].weight: expected number >= 0.0",
            "slo.classes[1].ttft_ms: expected number, got string",
            "slo.classes[0].name: must be non-empty without whitespace, got 'a b'",
            "slo.default_class: unknown SLO class 'zzz' (known: chat)",
            "slo.rules[0].class: unknown SLO class 'nah' (known: chat)",
            "slo.rules[0].path: unknown path '/v2' (known: /v1/chat/completions, /v1/completions, "
            "/v1/embeddings)",
            "ordering.plugin: unknown ordering plugin 'lifo' (known: edf, fcfs, priority-bands, slack)",
            "placement.picker.plugin: unknown picker plugin 'nope' "
            "(known: cato-slack, max-score, power-of-two, round-robin)",
        )
    ]
    assert report.summary(path) == f"{path}: 9 problems (policy file)"


def test_a_gateway_config_also_reports_every_problem_of_its_policy(tmp_path: Path) -> None:
    policy = _write(tmp_path, POLICY_BAD, "policy.toml")
    path = _write(tmp_path, '[policy]\nfile = "policy.toml"\n[server]\nlisten = "x"\n', "gateway.toml")
    report = check_file(path)
    assert report.problems[0] == f"{path}:server.listen: expected HOST:PORT, got 'x'"
    assert report.problems[1:] == check_file(policy).problems
    assert report.policy_file == policy


def test_a_declared_class_with_a_problem_is_not_reported_again_where_it_is_named(tmp_path: Path) -> None:
    text = (
        POLICY_OK
        + '[slo]\ndefault_class = "a b"\n[[slo.classes]]\nname = "a b"\n[[slo.rules]]\nclass = "a b"\n'
    )
    path = _write(tmp_path, text)
    assert check_file(path).problems == [
        f"{path}:slo.classes[0].name: must be non-empty without whitespace, got 'a b'"
    ]


def test_a_bad_array_item_is_reported_once_without_follow_on_problems(tmp_path: Path) -> None:
    # The items are replaced by stand-ins (same indices); their empty urls are not reported again,
    # nor as duplicates of each other.
    path = _write(tmp_path, 'endpoints = ["x", "y"]\n')
    assert check_file(path).problems == [
        f"{path}:endpoints[0]: expected table, got string",
        f"{path}:endpoints[1]: expected table, got string",
    ]


@pytest.mark.parametrize(
    ("text", "kind", "problem", "summary"),
    [
        pytest.param(
            "",
            FileKind.UNKNOWN,
            "{path}: empty file (berth serve: no endpoints: give --endpoint URL or list [[endpoints]] "
            "in the config file)",
            "{path}: 1 problem (not a gateway config, policy, agent or models file)",
            id="empty",
        ),
        pytest.param(
            "# only a comment\n",
            FileKind.UNKNOWN,
            "{path}: empty file (berth serve: no endpoints: give --endpoint URL or list [[endpoints]] "
            "in the config file)",
            "{path}: 1 problem (not a gateway config, policy, agent or models file)",
            id="comment-only",
        ),
        pytest.param(
            "[sever]\nlisten = 1\n",
            FileKind.UNKNOWN,
            "{path}: not a gateway config, policy, agent or models file: unknown top-level keys sever (a "
            "gateway config has some of: {gateway_keys}; a policy file has ordering and placement; a "
            "models file has [[models]]; an agent config has state_dir, backend, devices, ...)",
            "{path}: 1 problem (not a gateway config, policy, agent or models file)",
            id="neither",
        ),
        pytest.param(
            "[server\n",
            FileKind.UNKNOWN,
            "{path}:1:8: TOML syntax error: expected ']' at the end of a table declaration",
            "{path}: 1 problem (not a gateway config, policy, agent or models file)",
            id="syntax",
        ),
    ],
)
def test_files_of_no_known_kind_are_refused(
    tmp_path: Path, text: str, kind: FileKind, problem: str, summary: str
) -> None:
    path = _write(tmp_path, text)
    report = check_file(path)
    keys = ", ".join(GATEWAY_KEYS)
    assert (report.kind, report.problems) == (kind, [problem.format(path=path, gateway_keys=keys)])
    assert report.summary(path) == summary.format(path=path)


@pytest.mark.parametrize(
    ("text", "summary"),
    [
        pytest.param(POLICY_OK, "{path}: ok (policy file)", id="policy"),
        pytest.param(
            '[[endpoints]]\nurl = "http://a:1"\n',
            "{path}: ok (gateway config; the packaged default policy)",
            id="gateway",
        ),
        pytest.param(
            '[server]\nlisten = "127.0.0.1:9"\n',
            "{path}: ok (gateway config; the packaged default policy; no [[endpoints]]: berth serve needs "
            "--endpoint flags)",
            id="gateway-without-endpoints",
        ),
        pytest.param(
            '[policy]\nfile = "p.toml"\n[[endpoints]]\nurl = "http://a:1"\n',
            "{path}: ok (gateway config; policy {dir}/p.toml)",
            id="gateway-with-policy",
        ),
    ],
)
def test_the_summary_says_which_kind_of_file_was_checked(tmp_path: Path, text: str, summary: str) -> None:
    _write(tmp_path, POLICY_OK, "p.toml")
    path = _write(tmp_path, text)
    report = check_file(path)
    assert report.problems == []
    assert report.summary(path) == summary.format(path=path, dir=tmp_path)


# ----------------------------------------------------------------------------- convert_all

_KEYS = st.sampled_from(
    ["server", "listen", "limits", "endpoints", "url", "cap", "models", "aliases", "engine", "class",
     "ordering", "placement", "picker", "plugin", "scorers", "weight", "slo", "classes", "name", "x"]
)  # fmt: skip
_LEAVES = st.one_of(
    st.integers(-3, 3), st.floats(-2, 2), st.booleans(), st.sampled_from(["", "a", "vllm", "http://a:1"])
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(raw=st.dictionaries(_KEYS, _VALUES, max_size=5), schema=st.sampled_from([GatewayFile, PolicyFile]))
def test_convert_all_never_raises_and_starts_with_converts_problem(raw: dict[str, Any], schema: Any) -> None:
    decoded = convert_all(raw, schema, label="f")
    first: ConfigError | None = None
    try:
        value = convert(raw, schema, label="f")
    except ConfigError as e:
        first = e
    if first is not None:
        assert [str(p) for p in decoded.problems[:1]] == [str(first)]
        assert decoded.value is None or isinstance(decoded.value, schema)
    else:
        assert decoded.problems == []
        assert decoded.value == value
    if decoded.value is not None:  # what it decoded really is a valid file
        assert msgspec.convert(msgspec.to_builtins(decoded.value), schema, strict=True) == decoded.value


REPO = Path(__file__).resolve().parents[2]


def test_the_example_config_installed_as_documented_finds_its_policy(tmp_path: Path) -> None:
    # conf/gateway.toml and systemd/README.md: copy the config and its policy to /etc/berth (here
    # tmp_path), then point [policy] file at the copy.
    etc = tmp_path / "berth"
    (etc / "policies").mkdir(parents=True)
    text = (REPO / "conf" / "gateway.toml").read_text()
    (etc / "policies" / "default.toml").write_text((REPO / "policies" / "default.toml").read_text())
    copied = _write(etc, text, "gateway.toml")
    assert check_file(copied).problems == [
        f"{copied}:policy.file: policy file not found: {tmp_path / 'policies' / 'default.toml'} "
        f"(relative to {etc}, the directory of this file)"
    ]
    assert 'file = "../policies/' in text  # what systemd/README.md's sed rewrites
    _write(etc, text.replace('file = "../policies/', 'file = "policies/'), "gateway.toml")
    report = check_file(copied)
    assert report.problems == []
    assert report.policy_file == etc / "policies" / "default.toml"


@pytest.mark.parametrize(
    ("name", "text", "kind"),
    [
        pytest.param("models.toml", "[[models]]\nname = 1\n", FileKind.MODELS, id="models"),
        pytest.param("node.toml", 'backend = "nope"\n', FileKind.AGENT, id="agent"),
    ],
)
def test_node_agent_files_are_named_as_such(tmp_path: Path, name: str, text: str, kind: FileKind) -> None:
    path = _write(tmp_path, text, name)
    report = check_file(path)
    assert report.kind is kind
    assert len(report.problems) == 1
    assert report.summary(path) == f"{path}: 1 problem ({kind})"


def test_berth_check_validates_prefix(tmp_path: Path) -> None:
    path = _write(tmp_path, '[prefix]\nsource = "exakt"\nblock_tokens = 0\n')
    assert check_file(path).problems == [
        f"{path}:prefix.source: invalid value 'exakt' (expected one of: auto, approximate, precise, off)",
        f"{path}:prefix.block_tokens: expected integer >= 1",
    ]
