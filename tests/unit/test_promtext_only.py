"""Parsing only what a reader needs (`PromParser.start(text, only)`), the previous page's unchanged lines
taken as they were, and `HistogramReader` (a histogram derived again only when its samples changed):
whatever is kept reads exactly as from a whole page, on real-shaped pages and on generated ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.telemetry.capacity import kv_capacity_tokens
from gateway.telemetry.engine_metrics import SGLANG_METRICS, VLLM_METRICS, EngineMetrics, HistogramReader
from gateway.telemetry.promtext import Exposition, Histogram, PromParser, Sample, parse

DATA = Path(__file__).parent / "data"
VLLM_PAGE = (DATA / "vllm_v1_dp2.prom").read_text()
SGLANG_PAGE = (DATA / "sglang.prom").read_text()
DIALECTS = [
    pytest.param(VLLM_METRICS, VLLM_PAGE, id="vllm"),
    pytest.param(SGLANG_METRICS, SGLANG_PAGE, id="sglang"),
]


def kept(expo: Exposition, only: frozenset[str]) -> dict[str, list[Sample]]:
    return {name: list(expo.samples(name)) for name in sorted(only) if expo.has(name)}


def mean_inputs(h: Histogram | None) -> tuple[float, float] | None:
    """What the engine cross-checks read of a histogram (its buckets are not scraped)."""
    return None if h is None else (h.count, h.sum)


def read(dialect: EngineMetrics, expo: Exposition) -> tuple[object, ...]:
    """Everything berth reads from a page."""
    return (
        dialect.gauges(expo),
        mean_inputs(dialect.ttft_histogram(expo)),
        mean_inputs(dialect.itl_histogram(expo)),
        dialect.prompt_tokens_total(expo),
        dialect.generation_tokens_total(expo),
        kv_capacity_tokens(expo),
    )


@pytest.mark.parametrize(("dialect", "page"), DIALECTS)
def test_what_berth_reads_is_the_same_from_the_kept_lines(dialect: EngineMetrics, page: str) -> None:
    whole = parse(page)
    parser = PromParser()
    for _ in range(2):  # the second page comes from the first's lines
        part = parser.parse(page, dialect.scraped)
        assert read(dialect, part) == read(dialect, whole)
        assert kept(part, dialect.scraped) == kept(whole, dialect.scraped)
        assert part.bad_lines == whole.bad_lines == 0
    # the e2e histogram is not read from a live page, nor the buckets of the others: skipped
    assert dialect.e2e_histogram(whole) is not None
    assert dialect.e2e_histogram(part) is None
    assert not part.has(dialect.ttft[0] + "_bucket")
    # the kept histograms keep their declared family
    assert part.families[dialect.ttft[0]].type == "histogram"


@pytest.mark.parametrize(("dialect", "page"), DIALECTS)
@pytest.mark.parametrize("lines", [1, 7, 64, 100_000])
def test_slices_with_only_read_what_the_whole_page_does(
    dialect: EngineMetrics, page: str, lines: int
) -> None:
    parser = PromParser()
    for _ in range(2):
        job = parser.start(page, dialect.scraped)
        while not job.step(lines):
            pass
        assert read(dialect, job.exposition) == read(dialect, parse(page))


def test_a_slice_of_lines_skipped_or_unchanged_takes_more_of_them() -> None:
    """A slice is a slice of work: lines skipped or taken from the previous page count a quarter."""
    parser = PromParser()
    steps = []
    for _ in range(2):
        job = parser.start(VLLM_PAGE, VLLM_METRICS.scraped)
        n = 1
        while not job.step(64):
            n += 1
        steps.append(n)
    lines = len(VLLM_PAGE.split("\n"))
    assert steps[0] < -(-lines // 64)  # most lines skipped
    assert steps[1] == -(-lines // (4 * 64))  # every line from the previous page


def test_skipped_lines_and_bad_lines() -> None:
    only = frozenset({"want", "want_bucket"})
    page = (
        "# HELP skip Not read.\n# TYPE skip gauge\n"
        'skip{a="1"} 1\nskip 2\nskip{a="1"} not-a-number\n'  # skipped by name: not checked further
        "# TYPE want histogram\n"
        'want_bucket{le="1"} 3\nwant_bucket{le="+Inf"} 4\n'
        "want{a= 1\n"  # a kept name, malformed: bad
        "\x00 garbage }}}\n"  # no name to tell: parsed, bad
        "this is not {prometheus text\n"  # not a valid name before '{': parsed, bad
        "skip\t7\n"  # no '{' or blank after the name: parsed (a good line, not kept: nothing reads it)
    )
    parser = PromParser()
    for _ in range(2):  # the same counts when the lines come from the previous page
        expo = parser.parse(page, only)
        assert expo.bad_lines == 3
        assert expo.value("want_bucket") == 7
        assert expo.families["want"].type == "histogram"
        assert expo.value("skip") == 7  # only the line that could not be told by its name
    assert parse(page).bad_lines == 4


def test_a_changed_line_is_read_again_and_a_gone_one_is_gone() -> None:
    only = frozenset({"a", "b"})
    parser = PromParser()
    first = parser.parse('a{x="1"} 1\nb 2\n# TYPE a gauge\n', only)
    second = parser.parse('a{x="1"} 5\n# TYPE a gauge\nc 3\n', only)
    assert (first.value("a"), first.value("b")) == (1.0, 2.0)
    assert (second.value("a"), second.value("b"), second.has("c")) == (5.0, None, False)
    assert second.families["a"].type == "gauge"


def test_a_contradicting_type_line_taken_from_the_previous_page_still_counts_as_bad() -> None:
    page = "# TYPE a gauge\n# TYPE a counter\na 1\n"
    parser = PromParser()
    assert [parser.parse(page, frozenset({"a"})).bad_lines for _ in range(2)] == [1, 1]


def test_another_only_does_not_take_the_previous_pages_lines() -> None:
    parser = PromParser()
    page = "a 1\nb 2\n"
    assert parser.parse(page, frozenset({"a"})).has("b") is False
    assert parser.parse(page, frozenset({"b"})).value("b") == 2.0


@settings(max_examples=200)
@given(
    st.lists(
        st.sampled_from(
            [
                'a{x="1"} 1',
                'a{x="2"} 2',
                "a 3",
                'a_bucket{le="1"} 1',
                'a_bucket{le="+Inf"} 2',
                "a_count 2",
                "a_sum 0.5",
                "# TYPE a histogram",
                "# TYPE a gauge",
                "# HELP a help",
                'b{x="1"} 4',
                "b 5",
                "# TYPE b counter",
                "b_total 6",
                "garbage {",
                "a{x= 1",
                "",
                "  a 7  ",
                "# EOF",
                "# free comment",
            ]
        ),
        max_size=30,
    ),
    st.lists(st.sampled_from(["a", "a_bucket", "a_count", "a_sum", "b", "b_total"]), max_size=4),
    st.booleans(),
)
def test_kept_names_read_as_from_the_whole_page(lines: list[str], names: list[str], twice: bool) -> None:
    text = "\n".join(lines) + "\n"
    only = frozenset(names)
    parser = PromParser()
    if twice:  # the lines come from a previous page with other values
        parser.parse(text.replace(" 1\n", " 9\n"), only)
    part = parser.parse(text, only)
    whole = parse(text)
    assert kept(part, only) == kept(whole, only)
    assert part.bad_lines <= whole.bad_lines


# ----------------------------------------------------------------------------- HistogramReader
def test_a_histogram_is_derived_again_only_when_its_samples_change() -> None:
    reader = HistogramReader()
    parser = PromParser()
    first = reader.read(parser.parse(VLLM_PAGE), VLLM_METRICS.ttft)
    assert first is not None
    assert first == VLLM_METRICS.ttft_histogram(parse(VLLM_PAGE))
    assert reader.read(parser.parse(VLLM_PAGE), VLLM_METRICS.ttft) is first
    # one bucket changes (count and sum do not: only the buckets tell): derived again
    line = next(
        line for line in VLLM_PAGE.split("\n") if line.startswith("vllm:time_to_first_token_seconds_bucket")
    )
    changed = VLLM_PAGE.replace(line, line.rpartition(" ")[0] + " 123456.0", 1)
    again = reader.read(parser.parse(changed), VLLM_METRICS.ttft)
    assert again is not first
    assert again == VLLM_METRICS.ttft_histogram(parse(changed))
    assert again != first


def test_histogram_reader_takes_the_first_name_present_and_none_without() -> None:
    reader = HistogramReader()
    older = (
        'vllm:time_per_output_token_seconds_bucket{le="+Inf"} 2\nvllm:time_per_output_token_seconds_count 2\n'
    )
    assert reader.read(parse(older), VLLM_METRICS.itl) == VLLM_METRICS.itl_histogram(parse(older))
    assert reader.read(parse("other 1\n"), VLLM_METRICS.itl) is None


def test_a_nan_sample_is_never_taken_as_unchanged() -> None:
    reader = HistogramReader()
    page = 'h_bucket{le="+Inf"} NaN\nh_count 1\n'
    first = reader.read(parse(page), ("h",))
    assert first is not None
    assert reader.read(parse(page), ("h",)) is not first
