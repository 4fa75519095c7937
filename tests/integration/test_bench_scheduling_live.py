"""The scheduling benchmark's live form (`berth-loadgen bench scheduling --live`), short: berth and a
baseline over HTTP in front of `berth-engine-sim --fleet`, to the report and a verdict (the figures of
such a short run are not judged)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.cli import main as loadgen_main


def test_a_short_live_run_reaches_its_report_and_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = "--live --duration 3 --seeds 1 --rates 1 --patterns pattern1 --no-aladdin --configs tuned"
    policies = ["--policies", "berth,round-robin"]
    assert loadgen_main(["bench", "scheduling", *argv.split(), *policies, "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1] in ("verdict: PASS", "verdict: FAIL")
    doc = orjson.loads((tmp_path / "report.json").read_bytes())
    assert doc["config"]["mode"] == "live"
    assert sorted(r["policy"] for r in doc["runs"]) == ["berth", "round-robin"]
    assert (tmp_path / "report.md").read_text().strip()
