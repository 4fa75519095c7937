"""The seat-ends diagnostic (`berth-loadgen diag seat-ends`): inside a short decisions run it meets
admission's pending loads, times both paths on the same loads (checking that they give the same ends)
and reports the break-even."""

from __future__ import annotations

import pytest

from loadgen.diag import seat_ends


def test_a_short_run_meets_pending_loads_and_reports_both_paths(capsys: pytest.CaptureFixture[str]) -> None:
    batches, run = seat_ends.measure("coding-assistant", 3, 16)
    assert batches  # admission met pending loads, and each batch's two paths gave the same ends
    assert all(b.n >= 1 and 0 <= b.kept <= b.n for b in batches)
    assert run.calls >= len(batches)
    assert run.pending == sum(b.n for b in batches)
    text = seat_ends.report(batches)
    assert text.startswith("pending loads | rows kept")
    if len(batches) >= 3:
        assert "fit over" in text
    assert seat_ends.main(["--rounds", "2", "--batch-from", "8"]) == 0
    assert "derived from 8 pending loads" in capsys.readouterr().out
