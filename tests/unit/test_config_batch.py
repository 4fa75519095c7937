"""[batch] in gateway.toml, --batch-dir, and where batches live by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.app import batch_dir
from gateway.config import apply_overrides, default_config, load_gateway_config
from gateway.config.check import check
from gateway.core.errors import ConfigError


def _cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gateway.toml"
    p.write_text(text)
    return p


def test_dir_is_relative_to_the_file(tmp_path: Path) -> None:
    cfg = load_gateway_config(_cfg(tmp_path, '[batch]\ndir = "state/b"\nmax_lines_in_flight = 8\n'))
    assert cfg.batch_dir == tmp_path / "state" / "b"
    assert cfg.batch.max_lines_in_flight == 8
    assert batch_dir(cfg, {"STATE_DIRECTORY": "/var/lib/berth"}) == tmp_path / "state" / "b"


def test_default_dir(tmp_path: Path) -> None:
    cfg = default_config(env={})
    assert batch_dir(cfg, {"STATE_DIRECTORY": "/var/lib/berth:/var/lib/other"}) == Path(
        "/var/lib/berth/batch"
    )
    assert batch_dir(cfg, {}) == Path("berth-state/batch").absolute()


def test_flag_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_gateway_config(_cfg(tmp_path, '[batch]\ndir = "a"\n'))
    assert apply_overrides(cfg, batch_dir="b").batch_dir == tmp_path / "b"
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="--batch-dir: not a directory"):
        apply_overrides(cfg, batch_dir="f")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            '[batch]\nslo_class = "nope"\n', "batch.slo_class: unknown SLO class 'nope'", id="class"
        ),
        pytest.param("[batch]\ncolour = 1\n", "batch.colour: unknown key", id="unknown-key"),
        pytest.param("[batch]\nmax_lines_in_flight = 0\n", "batch.max_lines_in_flight", id="range"),
        pytest.param("[batch]\nfile_expiry_s = 60\n", "batch.file_expiry_s", id="expiry"),
        pytest.param('[batch]\ndir = "gateway.toml"\n', "batch.dir: not a directory", id="dir-is-a-file"),
    ],
)
def test_check_names_the_key(tmp_path: Path, text: str, problem: str) -> None:
    problems = check(_cfg(tmp_path, text + '[[endpoints]]\nurl = "http://127.0.0.1:9"\n'))
    assert any(problem in p for p in problems), problems
