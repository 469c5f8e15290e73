"""The package's shape, read from the sources alone (ast; nothing of grpokit is imported).

1. No import circle anywhere in src/grpokit: every ``import`` and ``from ... import`` counts, the ones
   inside functions and under ``if TYPE_CHECKING`` included, because a lazy import only hides a
   circle (the modules still depend on each other, and the import order decides whether it works).
2. No module inside grpokit imports a name from a package ``__init__`` that re-exports (the public
   faces ``grpokit.config``, ``grpokit.train``, ``grpokit.trl``, ``grpokit.cli``, ``grpokit.data``):
   inside src, a name comes from the module that defines it, so the public face can import anything
   without closing a circle.

An edge ``a -> b`` means module ``a`` names module ``b`` in an import. ``from pkg import sub`` is an
edge to ``pkg.sub`` when ``sub`` is a submodule, and to ``pkg`` (its ``__init__``) otherwise; parent
packages that Python runs on the way are not edges (every submodule would depend on its package).
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.import_graph import ROOT, import_graph, imported, module_names
from helpers.paths import ROOT as REPO

PUBLIC_FACES = ("grpokit.config", "grpokit.train", "grpokit.trl", "grpokit.cli", "grpokit.data")


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_circle_finder_finds_a_two_and_a_three_module_circle_and_no_false_one():
    # a <-> b is a circle; c -> d -> e -> c another; f -> a hangs off the first without joining it
    edges = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(circles(edges)) == [["a", "b"], ["c", "d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_lazy_and_type_checking_imports_are_edges(tmp_path):
    # a function-level import and one under TYPE_CHECKING both make a circle with b's top-level import
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\ndef g():\n    pass\n"
    )
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]


def test_no_import_circle_in_src():
    found = circles(import_graph())
    assert not found, "import circles (move the shared name to a leaf module): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments), not ones it imports."""
    out = set()
    for n in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                out |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return out


def reexport_imports(root: Path = ROOT) -> list[str]:
    """Every ``from PKG import NAME`` inside the package where PKG is a package ``__init__`` that does not
    define NAME itself (it re-exports it, eagerly or through a lazy ``__getattr__``), and every plain
    import of a public face (a package's own ``__main__`` may run its face)."""
    mods = module_names(root)
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}
    bad = []
    for m, p in mods.items():
        for target, name, line in imported(m, p, mods):
            if target not in packages or m == target:
                continue
            where = f"{p.relative_to(root.parent)}:{line}"
            if name is not None and name not in defined_names(mods[target]):
                bad.append(f"{where} imports {name} from the package {target}")
            elif name is None and target in PUBLIC_FACES and p.name != "__main__.py":
                bad.append(f"{where} imports the public face {target}")
    return bad


def test_no_module_imports_a_reexported_name_from_a_package():
    bad = reexport_imports()
    assert not bad, "import from the defining module instead: " + "; ".join(bad)


def test_the_reexport_check_sees_a_violation_and_allows_a_name_the_package_defines(tmp_path):
    # grpokit/x.py: `from grpokit.config import Config` re-exported (reported), `from grpokit.config import
    # helper` defined in config/__init__.py itself (fine), and the defining module's import (fine)
    pkg = tmp_path / "grpokit"
    (pkg / "config").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "__init__.py").write_text("from .sections import Config\n\ndef helper():\n    pass\n")
    (pkg / "config" / "sections.py").write_text("class Config:\n    pass\n")
    (pkg / "x.py").write_text(
        "from grpokit.config import Config, helper\nfrom grpokit.config.sections import Config as C\n"
    )
    assert reexport_imports(pkg) == ["grpokit/x.py:1 imports Config from the package grpokit.config"]


def cross_test_imports(tests: Path) -> list[str]:
    """Every import of one test module (or conftest) by another: shared code belongs in tests/helpers."""
    import ast

    bad = []
    for p in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                last = name.split(".")[-1]
                if last.startswith("test_") or last == "conftest" or name.startswith("tests."):
                    bad.append(f"{p.relative_to(tests)}:{node.lineno} imports {name}")
    return bad


def test_tests_mirror_the_source_and_import_no_other_test_module():
    tests = REPO / "tests"
    assert not cross_test_imports(tests), "move shared code to tests/helpers: " + "; ".join(cross_test_imports(tests))
    flat = sorted(p.name for p in tests.glob("test_*.py"))
    assert not flat, f"test files belong in tests/<package>/ beside what they test, not flat in tests/: {flat}"
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders - packages <= {"project"}, (
        f"test folders without a source package: {folders - packages - {'project'}}"
    )


def test_the_cross_import_check_sees_a_test_importing_another(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "test_x.py").write_text("from test_y import helper\nimport helpers.runs\n")
    (tmp_path / "test_z.py").write_text("from conftest import tiny_llama\n")
    assert cross_test_imports(tmp_path) == ["a/test_x.py:1 imports test_y", "test_z.py:1 imports conftest"]
