"""The modules of ``traceguard/report`` import each other without a loop.

``report/markdown.py`` imported ``report/workloads.py`` (inside a function, to dodge the loop) and
``report/workloads.py`` imported ``markdown.table``: a loop that works only while one side defers
its import. The shared Markdown table now lives below both (``report/tables.py``). The graph is
read from the source with ``ast`` — every import, at module level or inside a function — so a
deferred import cannot hide a loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

REPORT = REPO / "traceguard" / "report"
PACKAGE = "traceguard.report"


def _module_name(path: Path) -> str:
    return PACKAGE if path.name == "__init__.py" else f"{PACKAGE}.{path.stem}"


def _imported(node: ast.AST, module: str, modules: set[str]) -> set[str]:
    """The report modules one import statement names (``import a.b``, ``from a import b``,
    ``from .b import c``, ``from . import b``)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            parts = module.split(".")
            package = parts if module == PACKAGE else parts[:-1]
            base_parts = package[: len(package) - node.level + 1]
            base = ".".join([*base_parts, *([node.module] if node.module else [])])
        else:
            base = node.module or ""
        names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
    found = set()
    for name in names:
        if name in modules and name != module and name != PACKAGE:
            found.add(name)
    return found


def import_graph(folder: Path = REPORT) -> dict[str, set[str]]:
    """Report module → the report modules it imports anywhere in its source."""
    files = {_module_name(p): p for p in sorted(folder.glob("*.py"))}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[module] = set().union(*(_imported(node, module, modules) for node in ast.walk(tree)))
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_report_modules_import_each_other_without_a_loop() -> None:
    graph = import_graph()
    assert len(graph) >= 10  # the package was read
    assert loops(graph) == []


def test_the_markdown_table_lives_below_every_renderer_that_uses_it() -> None:
    graph = import_graph()
    users = {m for m, imported in graph.items() if f"{PACKAGE}.tables" in imported}
    assert {f"{PACKAGE}.{m}" for m in ("markdown", "workloads", "nccl", "sweep")} <= users
    assert graph[f"{PACKAGE}.tables"] == set()
    assert f"{PACKAGE}.markdown" not in graph[f"{PACKAGE}.workloads"]


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        # The loop the issue found: one side's import deferred into a function still counts.
        (
            {
                "markdown.py": "def render():\n    from traceguard.report.workloads import section\n",
                "workloads.py": "from traceguard.report.markdown import table\n",
            },
            [[f"{PACKAGE}.markdown", f"{PACKAGE}.workloads"]],
        ),
        ({"a.py": "from . import b\n", "b.py": "from .c import x\n", "c.py": "import traceguard.report.a\n"}, None),
        ({"a.py": "from traceguard.report import tables\n", "tables.py": "X = 1\n"}, []),
    ],
    ids=["deferred-import-loop", "relative-three-module-loop", "no-loop"],
)
def test_the_loop_finder_sees_loops(tmp_path: Path, sources: dict[str, str], expected: list[list[str]] | None) -> None:
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    found = loops(import_graph(tmp_path))
    if expected is None:
        assert found == [[f"{PACKAGE}.a", f"{PACKAGE}.b", f"{PACKAGE}.c"]]
    else:
        assert found == expected
