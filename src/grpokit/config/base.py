"""The two names every config module shares: ``ConfigError`` (a user's mistake, one sentence) and the
``section`` decorator (a dataclass that remembers which of its fields were assigned). A leaf module, so
that a section may live in its own file (optim.py) while sections.py gathers them into ``Config``."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Iterator


class ConfigError(ValueError):
    """A user's configuration mistake; its message is one sentence meant for the console."""


@contextlib.contextmanager
def named_as(fields: dict[str, str]) -> Iterator[None]:
    """A ConfigError raised in the block names the field the user set, not the run's own field that a
    derived config (a domain's, a teacher's) passed the value through: each ``fields`` key (a dotted
    name, e.g. ``data.answer_column``) becomes its value (``data.domains.mine.answer_column``)."""
    try:
        yield
    except ConfigError as e:
        names = sorted(fields, key=len, reverse=True)  # data.task_params before data.task
        pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")(?![\w])")
        raise ConfigError(pattern.sub(lambda m: fields[m.group(1)], str(e))) from None


def section(cls: type) -> type:
    """A config section: a dataclass that remembers which fields were assigned after defaults were
    filled in (constructor arguments, ``obj.field = v``, YAML, overrides), read with ``assigned``.
    Settings that depend on the run (the demo's, a preset's) fill only the other fields."""
    cls = dataclass(cls)
    init = cls.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_assigned", None)  # the generated __init__ fills defaults: not assignments
        init(self, *args, **kwargs)
        names = [f.name for f in dataclasses.fields(self)]
        object.__setattr__(self, "_assigned", set(names[: len(args)]) | set(kwargs))

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if self.__dict__.get("_assigned") is not None:
            self._assigned.add(name)

    cls.__init__, cls.__setattr__ = __init__, __setattr__
    return cls
