"""The command line of the workload options: `run` and `sim` take them (mooncake:PATH, --time-scale,
--slo-ttft-ms, --slo-itl-ms, sessions, turns, ...), `workload-stats` prints the reusable share, and an
option a workload does not take is an error."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.cli import _options, build_parser, main
from loadgen.workloads import WorkloadOptions

FIXTURE = Path(__file__).parent / "data" / "mooncake_small.jsonl"
MOONCAKE = f"mooncake:{FIXTURE}"


def test_run_takes_the_mooncake_interface() -> None:
    mooncake = ["--workload", MOONCAKE, "--time-scale", "0.5", "--slo-ttft-ms", "800", "--slo-itl-ms", "40"]
    args = build_parser().parse_args(["run", "--target", "http://x", *mooncake])
    opts = _options(args)
    assert opts.workload == MOONCAKE
    assert opts.workload_options == WorkloadOptions(time_scale=0.5, slo_ttft_ms=800.0, slo_itl_ms=40.0)


def test_run_takes_the_session_options() -> None:
    chat = [
        "--sessions",
        "9",
        "--turns",
        "3:6",
        "--think-time",
        "1.5",
        "--apps",
        "2",
        "--system-tokens",
        "700",
    ]
    args = build_parser().parse_args(["run", "--target", "x", "--workload", "chat", *chat])
    assert _options(args).workload_options == WorkloadOptions(
        sessions=9, turns=(3, 6), think_time_s=1.5, apps=2, system_tokens=(700, 700)
    )
    args = build_parser().parse_args(
        ["run", "--target", "x", "--workload", "coding", "--context-tokens", "1:2"]
    )
    with pytest.raises(ValueError, match="needs --sessions"):
        _options(args)


def test_defaults_give_no_options() -> None:
    args = build_parser().parse_args(["run", "--target", "x"])
    assert _options(args).workload_options == WorkloadOptions()
    assert not _options(args).workload_options.given()


def test_a_bad_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["sim", "--fleet", "f", "--workload", "chat", "--turns", "3:x"])
    assert e.value.code == 2
    assert "LO:HI" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "sharegpt-like", "--turns", "2"], "--turns does not apply"),
        (["--workload", "mooncake:"], "mooncake:PATH"),
        (["--workload", "mooncake:/nonexistent.jsonl"], "nonexistent"),
        (["--workload", "chat", "--time-scale", "2"], "--time-scale does not apply"),
    ],
    ids=["turns", "no-path", "no-file", "time-scale"],
)
def test_option_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload-stats", *argv]) == 2
    assert message in capsys.readouterr().err


def test_workload_stats_prints_the_share(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload-stats", "--workload", MOONCAKE, "--duration", "0", "--block-size", "512"]) == 0
    out = capsys.readouterr().out
    assert "mooncake:mooncake_small.jsonl" in out
    assert "48.0 %" in out  # 12 of 25 full blocks (tests/unit/test_mooncake_trace.py)
    assert main(["workload-stats", "--workload", "sharegpt-like", "--rate", "3", "--duration", "10"]) == 0
    out = capsys.readouterr().out
    assert out.count(" 0.0 %") == 2  # the default block sizes, 16 and 512


def test_sim_replays_a_mooncake_trace(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[defaults]\nprofile = "test-fast"\nmax_model_len = 8192\n'
        '[[endpoints]]\nid = "a"\nmodels = ["m"]\ncount = 2\n'
    )
    out = tmp_path / "report.json"
    argv = ["sim", "--fleet", str(fleet), "--workload", MOONCAKE, "--duration", "0", "-q", "--out", str(out)]
    assert main([*argv, "--time-scale", "0.5", "--slo-ttft-ms", "5000", "--slo-itl-ms", "100"]) == 0
    report = orjson.loads(out.read_bytes())
    assert report["overall"]["count"] == 10
    assert report["overall"]["errors"] == 0
    assert report["run"]["workload_options"] == {
        "slo_itl_ms": 100.0,
        "slo_ttft_ms": 5000.0,
        "time_scale": 0.5,
    }
