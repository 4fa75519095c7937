"""The Prometheus text parser: line tables, grouping, helpers, real-shaped pages, and hypothesis
properties (it never raises; well-formed pages round-trip)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.promtext import Exposition, Histogram, MetricType, PromParser, Sample, parse

DATA = Path(__file__).parent / "data"
VLLM_PAGE = (DATA / "vllm_v1_dp2.prom").read_text()
SGLANG_PAGE = (DATA / "sglang.prom").read_text()


def flat(expo: Exposition) -> list[Sample]:
    return [s for fam in expo.families.values() for s in fam.samples]


def key(name: str, labels: dict[str, str], value: float) -> tuple[str, tuple[tuple[str, str], ...], float]:
    return name, tuple(sorted(labels.items())), value


def only_sample(expo: Exposition) -> Sample:
    samples = [s for fam in expo.families.values() for s in fam.samples]
    assert len(samples) == 1, samples
    return samples[0]


# ----------------------------------------------------------------------------- single lines
@pytest.mark.parametrize(
    ("line", "name", "labels", "value"),
    [
        pytest.param("up 1", "up", {}, 1.0, id="bare"),
        pytest.param("up 1 1700000000000", "up", {}, 1.0, id="timestamp"),
        pytest.param("up 1.5e+09", "up", {}, 1.5e9, id="exponent"),
        pytest.param("a:b_c 2", "a:b_c", {}, 2.0, id="colon-name"),
        pytest.param('x{a="1"} 3', "x", {"a": "1"}, 3.0, id="one-label"),
        pytest.param('x{a="1",b="2"} 3', "x", {"a": "1", "b": "2"}, 3.0, id="two-labels"),
        pytest.param('x{a="1",} 3', "x", {"a": "1"}, 3.0, id="trailing-comma"),
        pytest.param('x{ a = "1" , b="2" } 3', "x", {"a": "1", "b": "2"}, 3.0, id="blanks-in-block"),
        pytest.param('x {a="1"} 3', "x", {"a": "1"}, 3.0, id="blank-before-brace"),
        pytest.param("x{} 3", "x", {}, 3.0, id="empty-block"),
        pytest.param('x{a="1"}\t3\t17', "x", {"a": "1"}, 3.0, id="tabs"),
        pytest.param('x{a="q\\"uote"} 1', "x", {"a": 'q"uote'}, 1.0, id="escaped-quote"),
        pytest.param('x{a="back\\\\slash"} 1', "x", {"a": "back\\slash"}, 1.0, id="escaped-backslash"),
        pytest.param('x{a="new\\nline"} 1', "x", {"a": "new\nline"}, 1.0, id="escaped-newline"),
        pytest.param('x{a="\\\\n"} 1', "x", {"a": "\\n"}, 1.0, id="backslash-then-n"),
        pytest.param('x{a="odd\\q"} 1', "x", {"a": "odd\\q"}, 1.0, id="unknown-escape-kept"),
        pytest.param('x{a="}{ ,=\\""} 1', "x", {"a": '}{ ,="'}, 1.0, id="syntax-in-value"),
        pytest.param('x{path="} 2"} 1', "x", {"path": "} 2"}, 1.0, id="brace-blank-in-value"),
        pytest.param('x{a="ünï €"} 1', "x", {"a": "ünï €"}, 1.0, id="unicode-value"),
        pytest.param('x_bucket{le="+Inf"} 7', "x_bucket", {"le": "+Inf"}, 7.0, id="le-inf"),
        pytest.param('x{a="1"} 3 # {trace_id="t"} 0.5 1.7e9', "x", {"a": "1"}, 3.0, id="exemplar"),
    ],
)
def test_sample_lines(line: str, name: str, labels: dict[str, str], value: float) -> None:
    expo = parse(line)
    assert expo.bad_lines == 0
    assert only_sample(expo) == Sample(name, labels, value)


@pytest.mark.parametrize(
    ("text", "check"),
    [
        pytest.param("x NaN", math.isnan, id="nan"),
        pytest.param("x +Inf", lambda v: v == math.inf, id="plus-inf"),
        pytest.param("x -Inf", lambda v: v == -math.inf, id="minus-inf"),
        pytest.param("x Inf", lambda v: v == math.inf, id="inf"),
        pytest.param("x -0.0", lambda v: v == 0.0, id="negative-zero"),
    ],
)
def test_special_values(text: str, check: Callable[[float], bool]) -> None:
    assert check(only_sample(parse(text)).value)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("x", id="no-value"),
        pytest.param("x one", id="word-value"),
        pytest.param("x 1 2 3", id="too-many-fields"),
        pytest.param("x 1 soon", id="word-timestamp"),
        pytest.param("1x 1", id="name-starts-with-digit"),
        pytest.param("x-y 1", id="dash-in-name"),
        pytest.param('x{a="1" 1', id="unclosed-block"),
        pytest.param('x{a="1} 1', id="unclosed-quote"),
        pytest.param("x{a=1} 1", id="unquoted-value"),
        pytest.param('x{1a="1"} 1', id="bad-label-name"),
        pytest.param('x{a="1" b="2"} 1', id="missing-comma"),
        pytest.param('x{a="1",a="2"} 1', id="duplicate-label"),
        pytest.param('x{a="1\\"} 1', id="escape-eats-quote"),
        pytest.param("x{,} 1", id="lone-comma"),
        pytest.param('x{a="1"}1', id="no-blank-after-brace"),
        pytest.param('x{a="1"} ', id="labels-no-value"),
        pytest.param("# TYPE x", id="type-without-kind"),
        pytest.param("# TYPE x sideways", id="unknown-type"),
        pytest.param("# TYPE 1x gauge", id="type-bad-name"),
        pytest.param("# HELP", id="help-without-name"),
        pytest.param('{"utf8.name"} 1', id="quoted-utf8-name"),
        pytest.param("\x00\xff}}}", id="binary"),
    ],
)
def test_bad_lines_are_counted_not_raised(line: str) -> None:
    expo = parse(f"good 1\n{line}\nalso_good 2\n")
    assert expo.bad_lines == 1
    assert expo.value("good") == 1.0
    assert expo.value("also_good") == 2.0


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("\n\n  \n\t\n", id="blank-lines"),
        pytest.param("# just a comment\n#another\n# UNIT x seconds\n", id="comments"),
    ],
)
def test_pages_without_samples(text: str) -> None:
    expo = parse(text)
    assert expo.bad_lines == 0
    assert not any(fam.samples for fam in expo.families.values())


def test_crlf_and_surrounding_blanks() -> None:
    expo = parse('# TYPE x gauge\r\n  x{a="1"} 2  \r\n\r\n')
    assert expo.bad_lines == 0
    assert expo.families["x"].type == "gauge"
    assert expo.value("x", a="1") == 2.0


def test_eof_stops_parsing() -> None:
    expo = parse("a 1\n# EOF\nb 2\ngarbage here\n")
    assert expo.value("a") == 1.0
    assert expo.value("b") is None
    assert expo.bad_lines == 0


# ----------------------------------------------------------------------------- families
def test_help_and_type() -> None:
    expo = parse(
        "# HELP x The \\\\ thing\\nsecond line\n# TYPE x counter\nx_total 3\n# HELP y\n# TYPE y GAUGE\ny 1\n"
    )
    assert expo.families["x"].help == "The \\ thing\nsecond line"
    assert expo.families["x"].type == "counter"
    assert [s.name for s in expo.families["x"].samples] == ["x_total"]
    assert expo.families["y"].help == ""
    assert expo.families["y"].type == "gauge"


def test_missing_type_is_untyped() -> None:
    expo = parse('x 1\nx_bucket{le="1"} 2\n')
    assert expo.families["x"].type == "untyped"
    assert expo.families["x_bucket"].type == "untyped"


HISTOGRAM_PAGE = """\
# HELP lat Latency.
# TYPE lat histogram
lat_bucket{le="0.1",model_name="m"} 1
lat_bucket{le="1",model_name="m"} 3
lat_bucket{le="+Inf",model_name="m"} 4
lat_sum{model_name="m"} 5.5
lat_count{model_name="m"} 4
lat_created{model_name="m"} 1.7e9
# TYPE rpc summary
rpc{quantile="0.5"} 0.2
rpc_sum 10
rpc_count 40
rpc_created 1.7e9
# TYPE hits counter
hits_total 12
hits_created 1.7e9
"""


@pytest.mark.parametrize(
    ("family", "mtype", "names"),
    [
        pytest.param(
            "lat",
            "histogram",
            ["lat_bucket", "lat_bucket", "lat_bucket", "lat_sum", "lat_count", "lat_created"],
            id="histogram",
        ),
        pytest.param("rpc", "summary", ["rpc", "rpc_sum", "rpc_count", "rpc_created"], id="summary"),
        pytest.param("hits", "counter", ["hits_total", "hits_created"], id="openmetrics-counter"),
    ],
)
def test_suffixed_samples_join_their_declared_family(
    family: str, mtype: MetricType, names: list[str]
) -> None:
    expo = parse(HISTOGRAM_PAGE)
    assert expo.bad_lines == 0
    assert expo.families[family].type == mtype
    assert [s.name for s in expo.families[family].samples] == names
    assert set(expo.families) == {"lat", "rpc", "hits"}


def test_prometheus_client_created_gauges_stay_their_own_family() -> None:
    # prometheus_client's format 0.0.4 writes `_created` as a separate gauge family with a TYPE line.
    expo = parse(
        '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_count 1\nh_sum 2\n'
        "# TYPE h_created gauge\nh_created 1.7e9\n"
    )
    assert [s.name for s in expo.families["h"].samples] == ["h_bucket", "h_count", "h_sum"]
    assert expo.families["h_created"].type == "gauge"


def test_histogram_family_whose_name_ends_in_total() -> None:
    # vLLM's vllm:iteration_tokens_total is a histogram, not a counter.
    expo = parse(
        '# TYPE vllm:iteration_tokens_total histogram\nvllm:iteration_tokens_total_bucket{le="+Inf"} 3\n'
        "vllm:iteration_tokens_total_count 3\nvllm:iteration_tokens_total_sum 30\n"
    )
    fam = expo.families["vllm:iteration_tokens_total"]
    assert fam.type == "histogram"
    assert len(fam.samples) == 3


def test_contradicting_type_line_is_bad() -> None:
    expo = parse("# TYPE x gauge\n# TYPE x counter\nx 1\n")
    assert expo.bad_lines == 1
    assert expo.families["x"].type == "gauge"


def test_openmetrics_types_fold_onto_the_text_format_ones() -> None:
    expo = parse(
        '# TYPE a unknown\na 1\n# TYPE b info\nb_info{v="1"} 1\n'
        '# TYPE c gaugehistogram\nc_bucket{le="+Inf"} 1\nc_gcount 1\nc_gsum 2\n'
        '# TYPE d stateset\nd{d="x"} 1\n'
    )
    assert {n: f.type for n, f in expo.families.items()} == {
        "a": "untyped",
        "b": "gauge",
        "c": "histogram",
        "d": "gauge",
    }
    assert len(expo.families["c"].samples) == 3


# ----------------------------------------------------------------------------- helpers
def test_value_sums_matching_samples() -> None:
    expo = parse('r{engine="0",m="a"} 3\nr{engine="1",m="a"} 2\nr{engine="0",m="b"} 10\n')
    assert expo.value("r") == 15.0
    assert expo.value("r", m="a") == 5.0
    assert expo.value("r", engine="0", m="b") == 10.0
    assert expo.value("r", m="zzz") is None
    assert expo.value("nope") is None


def test_histogram_merges_label_sets() -> None:
    expo = parse(
        "# TYPE t histogram\n"
        't_bucket{engine="0",le="0.1"} 1\nt_bucket{engine="0",le="1"} 3\nt_bucket{engine="0",le="+Inf"} 4\n'
        't_sum{engine="0"} 2\nt_count{engine="0"} 4\n'
        't_bucket{engine="1",le="0.1"} 0\nt_bucket{engine="1",le="1"} 5\nt_bucket{engine="1",le="+Inf"} 6\n'
        't_sum{engine="1"} 3\nt_count{engine="1"} 6\n'
    )
    h = expo.histogram("t")
    assert h == Histogram(buckets=((0.1, 1.0), (1.0, 8.0), (math.inf, 10.0)), sum=5.0, count=10.0)
    one = expo.histogram("t", engine="1")
    assert one is not None
    assert one.count == 6.0
    assert one.buckets[0] == (0.1, 0.0)
    assert expo.histogram("t", engine="7") is None
    assert expo.histogram("nothing") is None


def test_histogram_with_different_bucket_layouts_stays_monotone() -> None:
    expo = parse(
        't_bucket{s="a",le="1"} 2\nt_bucket{s="a",le="+Inf"} 2\n'
        't_bucket{s="b",le="2"} 5\nt_bucket{s="b",le="+Inf"} 6\n'
    )
    h = expo.histogram("t")
    assert h is not None
    assert h.buckets == ((1.0, 2.0), (2.0, 7.0), (math.inf, 8.0))
    assert h.count == 8.0  # no _count: the +Inf bucket
    assert math.isnan(h.sum)


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        pytest.param(0.0, 0.0, id="q0"),
        pytest.param(0.125, 0.5, id="inside-first-bucket"),
        pytest.param(0.5, 1.5, id="inside-second-bucket"),
        pytest.param(0.75, 2.0, id="bucket-edge"),
        pytest.param(1.0, 2.0, id="in-inf-bucket"),
    ],
)
def test_histogram_quantile(q: float, expected: float) -> None:
    h = Histogram(buckets=((1.0, 1.0), (2.0, 3.0), (math.inf, 4.0)), sum=6.0, count=4.0)
    assert h.quantile(q) == pytest.approx(expected)
    assert h.mean == 1.5


def test_histogram_quantile_without_observations() -> None:
    assert Histogram(buckets=((1.0, 0.0), (math.inf, 0.0)), sum=0.0, count=0.0).quantile(0.5) is None
    assert Histogram(buckets=(), sum=math.nan, count=math.nan).quantile(0.5) is None
    assert Histogram(buckets=((1.0, 0.0),), sum=0.0, count=0.0).mean is None


# ----------------------------------------------------------------------------- real-shaped pages
def test_vllm_page() -> None:
    expo = parse(VLLM_PAGE)
    assert expo.bad_lines == 0
    assert expo.families["vllm:num_requests_running"].type == "gauge"
    assert expo.value("vllm:num_requests_running") == 5.0
    assert expo.value("vllm:num_requests_waiting", engine="0") == 1.0
    # prometheus_client's 0.0.4 counters: family and samples carry `_total`, `_created` is separate
    assert expo.families["vllm:prompt_tokens_total"].type == "counter"
    assert expo.families["vllm:prompt_tokens_created"].type == "gauge"
    assert expo.families["http_request_size_bytes"].type == "summary"
    ttft = expo.histogram("vllm:time_to_first_token_seconds")
    per_engine = [expo.histogram("vllm:time_to_first_token_seconds", engine=e) for e in ("0", "1")]
    assert ttft is not None
    assert all(h is not None for h in per_engine)
    assert ttft.count == sum(h.count for h in per_engine if h is not None)
    assert len(ttft.buckets) == 23  # 22 bounds from vLLM's loggers.py and +Inf
    assert ttft.buckets[-1] == (math.inf, ttft.count)
    assert [c for _, c in ttft.buckets] == sorted(c for _, c in ttft.buckets)
    assert ttft.mean is not None
    assert 0.0 < ttft.mean < 10.0


@pytest.mark.parametrize("page", [pytest.param(VLLM_PAGE, id="vllm"), pytest.param(SGLANG_PAGE, id="sglang")])
def test_agrees_with_prometheus_client_parser(page: str) -> None:
    ours = sorted(key(s.name, s.labels, s.value) for s in flat(parse(page)))
    theirs = sorted(
        key(s.name, s.labels, s.value) for fam in text_string_to_metric_families(page) for s in fam.samples
    )
    assert ours == theirs


def test_parser_reuse_gives_the_same_result() -> None:
    parser = PromParser()
    first = parser.parse(VLLM_PAGE)
    second = parser.parse(VLLM_PAGE)
    assert flat(first) == flat(second)
    # label dicts handed out are copies, not the parser's cache
    next(iter(second.samples("vllm:num_requests_running"))).labels["engine"] = "changed"
    assert {s.labels["engine"] for s in parser.parse(VLLM_PAGE).samples("vllm:num_requests_running")} == {
        "0",
        "1",
    }


@pytest.mark.parametrize(
    "line",
    [
        pytest.param('x{a="1"} 2 1700000000 # a comment', id="timestamp-and-comment"),
        pytest.param('x{a="1"} 2# HELP y a comment run on', id="comment-run-on"),
    ],
)
def test_a_cached_label_set_reads_the_rest_of_the_line_as_an_uncached_one_does(line: str) -> None:
    """The fuzzer's find: a label set seen before took a shortcut that refused what followed the value."""
    parser = PromParser()
    parser.parse('x{a="1"} 1\n')  # caches the label set
    warm, fresh = parser.parse(line + "\n"), parse(line + "\n")
    assert (warm.value("x"), warm.bad_lines) == (fresh.value("x"), fresh.bad_lines) == (2.0, 0)


def _families(expo: Exposition) -> list[tuple[str, str, str, list[Sample]]]:
    return [(f.name, f.type, f.help, f.samples) for f in expo.families.values()]


@pytest.mark.parametrize("page", [pytest.param(VLLM_PAGE, id="vllm"), pytest.param(SGLANG_PAGE, id="sglang")])
@pytest.mark.parametrize("lines", [1, 7, 256, 100_000])
def test_a_page_parsed_a_slice_at_a_time_is_the_page_parsed_whole(page: str, lines: int) -> None:
    bad = page.replace("# TYPE", "# TYPE ?", 1) + "not a sample\n# EOF\nafter 1\n"
    for text in (page, bad):
        job = PromParser().start(text)
        steps = 1
        while not job.step(lines):
            steps += 1
            assert steps <= len(job.lines), "every step reads at least one line"
        whole = PromParser().parse(text)
        assert _families(job.exposition) == _families(whole)
        assert job.exposition.bad_lines == whole.bad_lines
        # The page (up to # EOF) in slices of `lines`: no slice reads more.
        read = text.split("\n").index("# EOF") + 1 if "# EOF" in text else len(job.lines)
        assert steps == -(-read // lines)
    assert parse(bad).bad_lines == 2
    assert not parse(bad).has("after")


def test_parser_cache_is_bounded() -> None:
    parser = PromParser(max_cached=10)
    page = "".join(f'x{{i="{i}"}} {i}\n' for i in range(50))
    for _ in range(3):
        assert parser.parse(page).value("x") == sum(range(50))
    assert len(parser._heads) <= 50


def test_prometheus_client_openmetrics_output_is_readable() -> None:
    # Newer prometheus_client releases write OpenMetrics sample names with '_' for ':'; the parser keeps
    # them (as untyped families) so dialects can read either spelling.
    page = (
        "# HELP vllm:prompt_tokens Number of prefill tokens processed.\n# TYPE vllm:prompt_tokens counter\n"
        'vllm_prompt_tokens_total{engine="0",model_name="m"} 5.0\n'
        'vllm_prompt_tokens_created{engine="0",model_name="m"} 1.7e9\n# EOF\n'
    )
    expo = parse(page)
    assert expo.bad_lines == 0
    assert expo.value("vllm_prompt_tokens_total") == 5.0


# ----------------------------------------------------------------------------- properties
@settings(max_examples=300)
@given(st.text())
def test_never_raises_on_any_text(text: str) -> None:
    expo = parse(text)
    assert expo.bad_lines >= 0


LINE_PIECES = st.sampled_from(
    [
        'x{a="',
        '"}',
        "} ",
        "{",
        "}",
        '"',
        "\\",
        ",",
        "=",
        " ",
        "\t",
        "\r",
        "\n",
        "#",
        "# HELP ",
        "# TYPE ",
        "+Inf",
        "NaN",
        "1",
        "le",
        "_bucket",
        "x",
        "histogram",
        "counter",
    ]
)


@settings(max_examples=300)
@given(st.lists(st.one_of(LINE_PIECES, st.text(max_size=3)), max_size=40))
def test_never_raises_on_near_miss_syntax(pieces: list[str]) -> None:
    parse("".join(pieces))


# Well-formed pages, written out by a small writer of our own, must read back exactly.
NAMES = st.from_regex(r"[a-zA-Z:][a-zA-Z0-9:]{0,12}", fullmatch=True)  # no '_': no suffix collisions
LABEL_NAMES = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: n != "le")
LABEL_VALUES = st.text(max_size=12)
VALUES = st.one_of(st.floats(allow_nan=False), st.integers(-(10**12), 10**12).map(float), st.just(math.inf))
HELP_TEXT = st.text(alphabet=st.characters(exclude_characters="\r"), max_size=20).map(
    lambda s: s.strip(" \t")
)


@st.composite
def families(draw: st.DrawFn) -> list[tuple[str, str, str, list[Sample]]]:
    names = draw(st.lists(NAMES, min_size=1, max_size=5, unique=True))
    out: list[tuple[str, str, str, list[Sample]]] = []
    for name in names:
        kind = draw(st.sampled_from(["counter", "gauge", "untyped", "histogram", "summary"]))
        help_text = draw(HELP_TEXT)
        label_sets = draw(
            st.lists(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=3), min_size=1, max_size=3)
        )
        samples: list[Sample] = []
        for labels in label_sets:
            if kind == "histogram":
                for le in ("0.5", "1.0", "+Inf"):
                    samples.append(Sample(f"{name}_bucket", {**labels, "le": le}, draw(VALUES)))
                samples.append(Sample(f"{name}_sum", labels, draw(VALUES)))
                samples.append(Sample(f"{name}_count", labels, draw(VALUES)))
            elif kind == "summary":
                samples.append(Sample(name, {**labels, "quantile": "0.5"}, draw(VALUES)))
                samples.append(Sample(f"{name}_sum", labels, draw(VALUES)))
                samples.append(Sample(f"{name}_count", labels, draw(VALUES)))
            elif kind == "counter":
                samples.append(Sample(f"{name}_total", labels, draw(VALUES)))
            else:
                samples.append(Sample(name, labels, draw(VALUES)))
        out.append((name, kind, help_text, samples))
    return out


def escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def write(page: list[tuple[str, str, str, list[Sample]]], *, crlf: bool, timestamps: bool) -> str:
    lines: list[str] = []
    for name, kind, help_text, samples in page:
        lines.append(f"# HELP {name} {escape_help(help_text)}")
        lines.append(f"# TYPE {name} {kind}")
        for s in samples:
            block = ",".join(f'{k}="{escape_value(v)}"' for k, v in s.labels.items())
            ts = " 1700000000000" if timestamps else ""
            lines.append(f"{s.name}{{{block}}} {s.value!r}{ts}" if block else f"{s.name} {s.value!r}{ts}")
    newline = "\r\n" if crlf else "\n"
    return newline.join(lines) + newline


@settings(max_examples=200)
@given(families(), st.booleans(), st.booleans())
def test_well_formed_pages_round_trip(
    page: list[tuple[str, str, str, list[Sample]]], crlf: bool, timestamps: bool
) -> None:
    expo = parse(write(page, crlf=crlf, timestamps=timestamps))
    assert expo.bad_lines == 0
    assert list(expo.families) == [name for name, _, _, _ in page]
    for name, kind, help_text, samples in page:
        fam = expo.families[name]
        assert fam.type == kind
        assert fam.help == help_text
        assert fam.samples == samples


@settings(max_examples=100)
@given(families())
def test_reused_parser_round_trips_too(page: list[tuple[str, str, str, list[Sample]]]) -> None:
    parser = PromParser()
    text = write(page, crlf=False, timestamps=False)
    first, second = parser.parse(text), parser.parse(text)
    for name, _, _, samples in page:
        assert first.families[name].samples == samples
        assert second.families[name].samples == samples
