"""The layering rule: which part of grpokit may import which, read from the sources alone (ast).

Layers, bottom to top; a module may import its own layer and the layers below it, never one above:

    types                records every stage shares (Prompt, Rollout, TokenBatch)
    config               the typed config sections, their I/O and presets
    grpokit              the package root (its version, the lazy public faces)
    algo, nn, optim      pure tensor math of stages 4-5, registries of stages; what the engines and the
                         trainer both ask of a torch model (CPU kernels, a frozen copy, attention kernel
                         names); optimizers and learning-rate schedules
    rewards, env         reward functions and their sandbox; tools and environments
    data                 prompts, files, images and the built-in tasks
    rollout              stage 2: engines, episodes, batches
    record               metrics sinks, health monitors, report
    config.validation    every value checked against the names the layers below register
    train                the trainer and what it needs (it validates the config it settles)
    trl, cli, __main__   the faces for users

Every import counts, lazy ones included (tests/helpers/import_graph.py), and none may go up: code that
needs a name from above moves down, or the name does (optim/ and the attention names in nn/ moved so
that validation could sit below the trainer that calls it).
"""

from __future__ import annotations

from helpers.import_graph import import_graph

LAYERS: tuple[tuple[str, ...], ...] = (
    ("types",),
    ("config",),
    ("grpokit",),
    ("algo", "nn", "optim"),
    ("rewards", "env"),
    ("data",),
    ("rollout",),
    ("record",),
    ("config.validation",),
    ("train",),
    ("trl", "cli", "__main__"),
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
    assert (
        layer_of("grpokit.train.models") > layer_of("grpokit.config.validation") > layer_of("grpokit.config.sections")
    )
    assert layer_of("grpokit.config.validation") > layer_of("grpokit.optim.optimizers")
    assert layer_of("grpokit.env.tools") == layer_of("grpokit.rewards.spec")
