"""``grpokit presets`` and ``grpokit models``: what a run can be configured with."""

from __future__ import annotations

import argparse


def cmd_presets(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpokit presets", description="List the presets and the values each sets.")
    p.add_argument("name", nargs="?", help="show only this preset")
    args = p.parse_args(argv)
    from grpokit.config import presets

    for name in [args.name] if args.name else presets.names():
        recipe, paper = presets.split(presets.load(name))
        print(f"{name}: {presets.description(name)}")
        for key, value in recipe.items():
            print(f"    {key} = {value}")
        own = presets.own_scale(name)
        for key, value in paper.items():
            print(f"    {key} = {value}" + ("" if own else "   (paper scale: only with --paper-scale)"))
    return 0


def cmd_models(argv: list[str]) -> int:
    argparse.ArgumentParser(
        prog="grpokit models",
        description="List the named real models that model.name_or_path "
        "accepts: size, source and whether they are installed and converted here.",
    ).parse_args(argv)
    from grpokit.train.named_models import listing

    for row in listing():
        print(f"{row['name']}: {row['parameters']} parameters, {row['description']}")
        print(f"    source = {row['source']}")
        print(f"    state  = {row['state']}")
    return 0
