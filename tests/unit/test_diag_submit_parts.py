"""The submit-parts diagnostic (`berth-loadgen diag submit-parts`): inside a short decisions run it times
the parts of the submits measured (and only those), the load cache's walk asked again at once giving the
same answers, and reports them per submit."""

from __future__ import annotations

import pytest

from loadgen.diag import submit_parts


def test_a_short_run_times_the_parts_of_the_measured_submits(capsys: pytest.CaptureFixture[str]) -> None:
    parts, result = submit_parts.measure("coding-assistant", 3)
    submits = result["submits"]
    assert submits >= 1
    assert parts.calls["submit"] == submits  # the fill's submits are not counted
    assert parts.calls["SLO admission"] == submits
    assert parts.calls[submit_parts.WALK] == parts.calls["load references (LoadCache.refs)"]
    # a part is within the submit that calls it
    assert parts.ns["SLO admission"] <= parts.ns["admission (scope and admitter)"] <= parts.ns["submit"]
    text = submit_parts.report(parts, result)
    assert "| µs a submit |" in text
    assert submit_parts.WALK in text
    assert submit_parts.main(["--rounds", "2"]) == 0
    assert "submits measured" in capsys.readouterr().out
