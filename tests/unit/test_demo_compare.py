"""`berth demo`'s first act: berth's preset beside a plain router on the fleet simulator, same trace."""

from __future__ import annotations

from pathlib import Path

from loadgen import demo_compare
from loadgen.bench.scheduling import classes


def test_both_routers_see_the_same_trace_and_the_table_shows_them_side_by_side(tmp_path: Path) -> None:
    said: list[str] = []
    sides = demo_compare.run(tmp_path, rate=2.0, backlog=60, duration_s=8.0, log=said.append)
    assert [s.name for s in sides] == ["least-outstanding", "berth chat-and-batch"]
    assert said == ["simulating least-outstanding ...", "simulating berth chat-and-batch ..."]
    plain, berth = sides
    for cls in ("interactive", "batch"):
        assert plain.count(cls) == berth.count(cls) > 0  # one trace for both
    assert berth.count("batch") == 60
    assert (tmp_path / "d-berth" / "policy.toml").read_text().startswith(classes.PRESET.read_text()[:40])
    text = demo_compare.table(sides)
    lines = text.splitlines()
    assert "least-outstanding" in lines[0]
    assert "berth chat-and-batch" in lines[0]
    assert any(line.startswith("interactive goodput") for line in lines)
    assert any(line.startswith("preemptions") for line in lines)
    assert len(lines) == 8
    png = tmp_path / "latency.png"
    why_not = demo_compare.plot(sides, png)
    if why_not is None:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # the optional plot extra is missing
        assert "matplotlib" in why_not
