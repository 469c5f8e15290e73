"""A dataclass field's docstring (the string literal under it) becomes its ``help``, so that
transformers' ``HfArgumentParser`` and TRL's ``TrlParser`` show it under ``--help``.
"""

from __future__ import annotations

import dataclasses


def help_from_docstrings(cls: type) -> None:
    """Each declared field's docstring (the line under it) becomes its ``help``, which ``--help`` shows."""
    import ast
    import inspect

    try:
        body = ast.parse(inspect.getsource(cls)).body[0].body
    except (OSError, TypeError):  # installed without its sources: the fields keep no help text
        return
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            f = fields[node.target.id]
            f.metadata = {**f.metadata, "help": " ".join(after.value.value.split()).replace("%", "%%")}
