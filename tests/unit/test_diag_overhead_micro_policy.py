"""`diag overhead-micro --policy` takes a shipped preset's name and refuses anything else up front."""

from __future__ import annotations

import pytest

from loadgen.diag import overhead_micro


def test_unknown_policy_named_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        overhead_micro.main(["--pieces", "fleet_100", "--policy", "policies/aladdin.toml", "--rounds", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--policy 'policies/aladdin.toml'" in err
    assert "coding-assistant" in err
    assert "chat-and-batch" in err
