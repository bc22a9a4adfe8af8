"""The eviction family's rooms keep to themselves (issue #42): no module of `cache/eviction/` or
`integrations/sglang/` reads another module's private attribute, and SGLang's private tree-core
names are touched in one file only (`integrations/sglang/tree.py`).

A read `x._name` (x not `self` / `cls`) is fine where `_name` is the module's own (a method, a class
attribute, a slot or a `self._name` it assigns) or, in `cache/eviction/`, one the index offers its
policies (`IndexInternals`, view.py). A private name no radixflow module defines is SGLang's.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "radixflow"
ROOMS = sorted([*(SRC / "cache" / "eviction").glob("*.py"), *(SRC / "integrations" / "sglang").glob("*.py")])
SGLANG_TREE = SRC / "integrations" / "sglang" / "tree.py"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, class attributes, slots, `self._x = ...`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    out.add(t.id)
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                    out.add(t.attr)
                if isinstance(t, ast.Name) and t.id == "__slots__" and isinstance(node.value, (ast.Tuple, ast.List)):
                    out.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    return {n for n in out if _private(n)}


def reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every `x._name` whose `x` is not `self` or `cls`."""
    return [(node.lineno, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _private(node.attr)
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]


def index_internals() -> set[str]:
    tree = ast.parse((SRC / "cache" / "eviction" / "view.py").read_text())
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "IndexInternals"]
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)} | {
        n.name for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_no_eviction_module_reads_another_modules_private_attribute():
    trees = {p: ast.parse(p.read_text(), str(p)) for p in ROOMS}
    ours = {p: defined(t) for p, t in trees.items()}
    everywhere = set().union(*(defined(ast.parse(p.read_text())) for p in SRC.rglob("*.py")))
    friends = index_internals()
    bad = []
    for p, tree in trees.items():
        for line, name in reads(tree):
            if name in ours[p] or (p.parent.name == "eviction" and name in friends):
                continue
            if p == SGLANG_TREE and name not in everywhere:
                continue  # SGLang's own, in the one file that may touch it
            bad.append(f"{p.relative_to(SRC)}:{line} reads ._{name.lstrip('_')}")
    assert bad == []


def test_the_check_sees_a_read_across_modules():
    tree = ast.parse("def f(pol, core):\n    return pol._rotation, core._node_arena, self._own\n")
    assert [n for _, n in reads(tree)] == ["_rotation", "_node_arena"]
    assert "_rotation" in defined(ast.parse("class R:\n    def __init__(self):\n        self._rotation = 1\n"))
