"""The layering rule: which part of grpokit may import which, read from the sources alone (ast).

Layers, bottom to top; a module may import its own layer and the layers below it, never one above:

    types, version       records every stage shares (Prompt, Rollout, TokenBatch); the version string
    config               the typed config sections, their I/O and presets
    algo, nn, optim      pure tensor math of stages 4-5, registries of stages; what the engines and the
                         trainer both ask of a torch model (CPU kernels, a frozen copy, attention kernel
                         names); optimizers and learning-rate schedules
    rewards, env         reward functions and their sandbox; tools and environments
    data                 prompts, files, images and the built-in tasks
    rollout              stage 2: engines, episodes, batches
    record               metrics sinks, health monitors, report
    validation           every value checked against the names the layers below register
    train                the trainer and what it needs (it validates the config it settles)
    trl, cli, __main__,  the faces for users; the package root lazily loads the trainer (``from grpokit
    grpokit              import Trainer``), so nothing inside imports it

Every import counts, lazy ones included (tests/helpers/import_graph.py), and none may go up: code that
needs a name from above moves down, or the name does (optim/ and the attention names in nn/ moved so
that validation could sit below the trainer that calls it).

A second rule is coarser: no two packages (a top-level module such as ``types`` counts as one) import
each other, whichever modules the two imports come from. The layers alone allowed ``config`` to import
``algo`` from its ``validation`` sub-layer while ``algo`` imported ``config``; the checks that read the
stages' registries are now their own package, ``validation``, above the stages.
"""

from __future__ import annotations

from helpers.import_graph import import_graph

LAYERS: tuple[tuple[str, ...], ...] = (
    ("types", "version"),
    ("config",),
    ("algo", "nn", "optim"),
    ("rewards", "env"),
    ("data",),
    ("rollout",),
    ("record",),
    ("validation",),
    ("train",),
    ("trl", "cli", "__main__", "grpokit"),
)


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module`` (``grpokit.x.y``): its longest listed prefix."""
    name = module.removeprefix("grpokit.") if module != "grpokit" else "grpokit"
    best, index = "", None
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    assert index is not None, f"{module} is in no layer; add its package to LAYERS"
    return index


def upward_imports() -> set[tuple[str, str]]:
    short = lambda m: m.removeprefix("grpokit.")  # noqa: E731
    return {(short(a), short(b)) for a, targets in import_graph().items() for b in targets if layer_of(a) < layer_of(b)}


def test_no_import_goes_up_a_layer():
    found = sorted(upward_imports())
    assert not found, f"imports that go up a layer (tests/project/test_layering.py's rule): {found}"


def test_the_rule_catches_an_upward_import():
    assert layer_of("grpokit.algo.loss") < layer_of("grpokit.train.loop")  # so algo -> train would be reported
    assert layer_of("grpokit.train.models") > layer_of("grpokit.validation") > layer_of("grpokit.config.sections")
    assert layer_of("grpokit.validation") > layer_of("grpokit.optim.optimizers")
    assert layer_of("grpokit.env.tools") == layer_of("grpokit.rewards.spec")


def package_of(module: str) -> str:
    """The top-level package (or module) of ``grpokit.x.y``: ``x``; the root itself is ``grpokit``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def packages_both_ways(graph: dict[str, set[str]]) -> list[str]:
    """Every pair of packages with an import each way, named with one module-level edge each way."""
    edges: dict[tuple[str, str], tuple[str, str]] = {}
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            pair = (package_of(a), package_of(b))
            if pair[0] != pair[1]:
                edges.setdefault(pair, (a, b))
    return [
        f"{p} <-> {q} ({' -> '.join(edges[(p, q)])}; {' -> '.join(edges[(q, p)])})"
        for p, q in sorted(edges)
        if p < q and (q, p) in edges
    ]


def test_no_two_packages_import_each_other():
    found = packages_both_ways(import_graph())
    assert not found, "packages that import each other (move the shared name down): " + "; ".join(found)


def test_a_package_cycle_through_a_lazy_import_is_found(tmp_path):
    # a.x imports b.y at module level; b.z imports a.w inside a function: no module circle, a package one
    root = tmp_path / "grpokit"
    for pkg in ("a", "b"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "a" / "x.py").write_text("from grpokit.b import y\n")
    (root / "a" / "w.py").write_text("")
    (root / "b" / "y.py").write_text("")
    (root / "b" / "z.py").write_text("def f():\n    from grpokit.a import w\n    return w\n")
    assert packages_both_ways(import_graph(root)) == [
        "a <-> b (grpokit.a.x -> grpokit.b.y; grpokit.b.z -> grpokit.a.w)"
    ]
    (root / "b" / "z.py").write_text(
        "import importlib\n\ndef f():\n    return importlib.import_module('grpokit.a.w')\n"
    )
    assert len(packages_both_ways(import_graph(root))) == 1  # a lazy import by name is an import too
    (root / "b" / "z.py").write_text("")
    assert packages_both_ways(import_graph(root)) == []
