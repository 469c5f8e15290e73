"""The import graph of src/grpokit, read from the sources alone (ast; nothing of grpokit is imported),
shared by tests/project/test_structure.py (no circles, no re-exported names) and tests/project/test_layering.py.

An edge ``a -> b`` means module ``a`` names module ``b`` in an import, lazy ones and those under
``if TYPE_CHECKING`` included, and ``importlib.import_module("b")`` with the name written out (a name
computed at run time, a plugin's, is not an edge). ``from pkg import sub`` is an edge to ``pkg.sub`` when ``sub`` is a
submodule, and to ``pkg`` (its ``__init__``) otherwise.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "grpokit"


def module_names(root: Path) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imported(mod: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, str | None, int]]:
    """``(module, name or None, line)`` for every import in ``path``; ``name`` is the imported name of a
    ``from X import name`` that is not a submodule of X."""
    out = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            out += [(a.name, None, n.lineno) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                base = ".".join(base[: len(base) - n.level + 1] + ([n.module] if n.module else []))
            else:
                base = n.module or ""
            for a in n.names:
                sub = f"{base}.{a.name}"
                out.append((sub, None, n.lineno) if sub in mods else (base, a.name, n.lineno))
        elif isinstance(n, ast.Call) and _names_import_module(n.func) and n.args:
            if isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
                out.append((n.args[0].value, None, n.lineno))
    return out


def _names_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = module_names(root)
    return {m: {t for t, _, _ in imported(m, p, mods) if t in mods and t != m} for m, p in mods.items()}
