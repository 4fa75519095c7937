"""No import circle anywhere in the daemon or the simulator, a package and its own modules included (the
import contracts' acyclic-siblings rule does not see a package that imports a module which imports the
package back)."""

from __future__ import annotations

import grimp
import pytest


def _cycles(graph: grimp.ImportGraph, root: str) -> list[list[str]]:
    """Strongly connected components of more than one module among `root`'s modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if not w.startswith(root):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(graph.modules):
        if m.startswith(root) and m not in index:
            visit(m)
    return out


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("gateway", "loadgen")


@pytest.mark.parametrize("root", ["gateway", "loadgen"])
def test_no_import_circle(graph: grimp.ImportGraph, root: str) -> None:
    assert _cycles(graph, root) == []


def test_the_check_finds_a_circle() -> None:
    g = grimp.ImportGraph()
    for m in ("pkg", "pkg.a", "pkg.b"):
        g.add_module(m)
    g.add_import(importer="pkg", imported="pkg.a")
    g.add_import(importer="pkg.a", imported="pkg.b")
    g.add_import(importer="pkg.b", imported="pkg")
    assert _cycles(g, "pkg") == [["pkg", "pkg.a", "pkg.b"]]
