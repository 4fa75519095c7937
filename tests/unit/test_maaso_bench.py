"""The MaaSO benchmark's quick run (the simulator, a short trace): every configuration runs on the same
trace, the heterogeneous fleet is the placer's, and the report and the setting's dict are written."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.bench.lifecycle import maaso, maaso_report, maaso_setup


def test_quick_run_writes_its_report(tmp_path: Path) -> None:
    status = maaso.main(["--quick", "--out", str(tmp_path), "--duration", "20"])
    assert status == 0  # it ran to the end, whatever its verdict
    result = orjson.loads((tmp_path / "report.json").read_bytes())
    assert result["setting"] == "maaso"
    assert {r["config"] for r in result["rows"]} == set(maaso_setup.CONFIGS)
    counts = {r["config"]: r["runs"] for r in result["rows"]}
    assert set(counts.values()) == {1}
    for r in result["rows"]:
        assert 0.0 <= r["attainment"]["mean"] <= 1.0
    for t in result["targets"]:
        assert set(t) == {"name", "measured", "gain", "target", "judged", "passed"}
        assert t["passed"] == (
            t["measured"] is not None and t["measured"] >= maaso_setup.HEADROOM_SHARE_TARGET
        )
    (placement,) = result["placements"].values()
    assert sum(placement["devices"].values()) <= maaso_setup.DEVICES
    # Every configuration saw the same requests.
    assert len({r["requests"] for r in result["runs"]}) == 1
    md = (tmp_path / "report.md").read_text()
    assert "| heterogeneous |" in md
    assert "PASS" in md or "FAIL" in md
    assert md == result["markdown"]


def test_setting_returns_the_shared_shape(tmp_path: Path) -> None:
    got = maaso.setting([3], True, out=tmp_path, log=lambda _: None, duration_s=10.0)
    assert set(got) >= {"setting", "rows", "targets", "markdown"}
    assert got["setup"]["seeds"] == [3]
    orjson.dumps(got)  # JSON-able


def test_the_share_of_headroom_gained() -> None:
    assert maaso_report.headroom_share(0.97, 0.94) == pytest.approx(0.5)
    assert maaso_report.headroom_share(1.0, 0.94) == pytest.approx(1.0)
    assert maaso_report.headroom_share(0.90, 0.94) < 0
    assert maaso_report.headroom_share(1.0, 1.0) == 1.0
