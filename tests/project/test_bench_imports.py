"""Every grpokit name a bench/ script imports (at the top or inside a function) exists: a module moved
by a refactor must take the benchmarks along (bench/rollout_speed.py once imported a moved module and
failed only when run)."""

import ast
import importlib

import pytest

from helpers.paths import ROOT

SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def grpokit_imports(path):
    """``(line, module, name or None)`` for each grpokit import in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpokit" and not node.level:
            yield from ((node.lineno, node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "grpokit")


def resolves(module: str, name: str | None) -> bool:
    mod = importlib.import_module(module)
    if name is None or hasattr(mod, name):
        return True
    try:
        importlib.import_module(f"{module}.{name}")
        return True
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_imports_resolve(script):
    found = list(grpokit_imports(script))
    missing = [f"{script.name}:{line} {m}{'.' + n if n else ''}" for line, m, n in found if not resolves(m, n)]
    assert not missing, f"bench imports that no longer exist: {missing}"


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "s.py"
    f.write_text("def main():\n    from grpokit.train import kernels\n    import grpokit.nn.kernels\n")
    found = list(grpokit_imports(f))
    assert found == [(2, "grpokit.train", "kernels"), (3, "grpokit.nn.kernels", None)]
    assert not resolves("grpokit.train", "kernels") and resolves("grpokit.nn", "kernels")
