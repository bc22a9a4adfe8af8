"""The package's layering (docs/ARCHITECTURE.md): no import circle between modules, and no import upward.

Every import counts, at module level or inside a function, `TYPE_CHECKING` blocks included: a lazy
import is still a dependency, it only hides the circle until run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "radixflow"

# folder -> packages of radixflow it must not import (they sit above it)
ABOVE = {
    "workloads": ("sim", "engine", "server", "report", "commands", "integrations", "cli"),
    "core": ("sim", "engine", "server", "report", "commands", "integrations", "cli", "workloads"),
    "cache": ("core", "sim", "engine", "server", "report", "commands", "integrations", "cli", "workloads"),
    "spec": ("core", "cache", "sim", "engine", "server", "report", "commands", "integrations", "cli", "workloads"),
    "sim": ("engine", "server", "report", "commands", "integrations", "cli"),
}
# The scheduler core sees integers and a `now` passed in: no torch, no HTTP, no clock.
FORBIDDEN_EXTERNAL = {
    "core": ("torch", "fastapi", "starlette", "uvicorn", "httpx", "requests", "aiohttp", "http", "time", "datetime"),
    "cache": ("torch", "fastapi", "starlette", "uvicorn", "httpx", "requests", "aiohttp", "http", "time", "datetime"),
}


def module_files(root: Path = SRC) -> dict[str, Path]:
    out = {}
    for p in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports_of(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(radixflow modules imported, top-level external packages imported) by one module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner, outer = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from radixflow.x import y` depends on module x.y if there is one, else on x
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            if t == PACKAGE or t.startswith(PACKAGE + "."):
                while t not in known and "." in t:
                    t = t.rpartition(".")[0]
                if t in known and t != name:
                    inner.add(t)
            else:
                outer.add(t.split(".")[0])
    return inner, outer


def import_graph(root: Path = SRC) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    files = module_files(root)
    inner, outer = {}, {}
    for name, path in files.items():
        inner[name], outer[name] = imports_of(name, path, set(files))
    return inner, outer


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_no_import_circle_between_modules(graph):
    inner, _ = graph
    assert "radixflow.core.scheduler" in inner and "radixflow.workloads.qa" in inner  # the walk found the tree
    assert circles(inner) == []


def test_no_module_imports_a_layer_above_it(graph):
    inner, _ = graph
    bad = [
        f"{m} imports {t}"
        for m, targets in inner.items()
        for t in sorted(targets)
        if folder(t) in ABOVE.get(folder(m), ())
    ]
    assert bad == []


def test_scheduler_core_imports_no_torch_http_or_clock(graph):
    _, outer = graph
    bad = [
        f"{m} imports {x}"
        for m, names in outer.items()
        for x in sorted(names)
        if x in FORBIDDEN_EXTERNAL.get(folder(m), ())
    ]
    assert bad == []


def test_the_checks_catch_a_circle_and_an_upward_import(tmp_path):
    pkg = tmp_path / PACKAGE
    for rel, text in {
        "__init__.py": "",
        "workloads/__init__.py": "",
        "workloads/gen.py": "def f():\n    from radixflow.sim.run import g  # lazy, still a dependency\n",
        "sim/__init__.py": "",
        "sim/run.py": "from . import other\nfrom radixflow.workloads import gen\n",
        "sim/other.py": "from radixflow.sim.run import g\nimport torch\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    inner, outer = import_graph(tmp_path)
    assert inner["radixflow.sim.run"] == {"radixflow.sim.other", "radixflow.workloads.gen"}
    assert circles(inner) == [["radixflow.sim.other", "radixflow.sim.run", "radixflow.workloads.gen"]]
    assert "radixflow.sim.run" in inner["radixflow.workloads.gen"] and "sim" in ABOVE["workloads"]
    assert outer["radixflow.sim.other"] == {"torch"}
