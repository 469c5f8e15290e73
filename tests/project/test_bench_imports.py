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


SHARED = {"workload.py", "timing.py", "alternate.py", "worker.py", "trl_oracle.py", "trl_examples_data.py"}
"""The pieces the scripts share, each named once in RESULTS.md's opening as what it is (not a measurement)."""


def test_every_bench_script_is_cited_by_results_or_is_a_shared_piece():
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    uncited = [p.name for p in SCRIPTS if p.name not in SHARED and f"bench/{p.name}" not in results]
    assert not uncited, f"bench/ keeps only scripts bench/RESULTS.md cites for a figure: {uncited}"
    assert all(name in results for name in SHARED)


def test_timing_and_alternation_are_shared_not_repeated():
    # the one timer (device synchronised) and the one rotation of sides live in timing.py and alternate.py
    repeated = [
        p.name
        for p in SCRIPTS
        if p.name not in {"timing.py", "alternate.py"}
        and ("def _sync(" in p.read_text() or "r % len(" in p.read_text() or "def _time(" in p.read_text())
    ]
    assert not repeated, f"use bench/timing.py and bench/alternate.py: {repeated}"
