"""What TRL's GRPOTrainer holds as one object a script may change in place, held as one object here too.

TRL reads ``reward_funcs``, ``reward_weights`` and ``generation_config`` afresh at every generation batch,
so scripts change them in place (``trainer.reward_weights[0] = 3.0`` in a curriculum callback,
``trainer.reward_funcs[0] = new_fn``, ``trainer.generation_config.max_new_tokens = 64`` in a subclass's
``__init__``). grpokit.trl holds each as one object that its run reads at every batch (held_rewards.py,
held_generation.py). What the run cannot follow once built (the metric names, the reward models'
tokenizers, the tools, the environment factories, the end-of-sequence ids, ``generation_kwargs``) is held
read-only: ``HeldList`` / ``HeldDict`` pass every change to their owner, which applies it or refuses it in one
sentence, so an in-place change is never silently dropped. A copy (``list(x)``, ``copy.deepcopy``) is a
plain one, the caller's own.
"""

from __future__ import annotations

from typing import Any, Callable

from grpokit.config.sections import ConfigError

_LIST_CHANGES = (
    "__setitem__",
    "__delitem__",
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
)
_DICT_CHANGES = ("__setitem__", "__delitem__", "update", "pop", "popitem", "clear", "setdefault")


class HeldList(list):
    """A list whose every change goes through ``on_change(new_items)``, which applies it (``replace_all``)
    or raises ConfigError."""

    def __init__(self, items: Any, on_change: Callable[[list], None]):
        super().__init__(items)
        self._on_change = on_change

    def replace_all(self, items: Any) -> None:
        """The owner's way in: the held contents become ``items`` (no ``on_change``)."""
        list.__setitem__(self, slice(None), list(items))

    def _change(self, op: str, *args: Any, **kwargs: Any) -> Any:
        new = list(self)
        out = getattr(list, op)(new, *args, **kwargs)
        self._on_change(new)
        return out

    def __iadd__(self, other: Any) -> HeldList:
        self._change("extend", other)
        return self

    def __imul__(self, n: int) -> HeldList:
        self._on_change(list(self) * n)
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        return list, (list(self),)


class HeldDict(dict):
    """A dict every change of which goes through ``on_change(new_items)`` (as HeldList)."""

    def __init__(self, items: Any, on_change: Callable[[dict], None]):
        super().__init__(items)
        self._on_change = on_change

    def _change(self, op: str, *args: Any, **kwargs: Any) -> Any:
        new = dict(self)
        out = getattr(dict, op)(new, *args, **kwargs)
        self._on_change(new)
        return out

    def __ior__(self, other: Any) -> HeldDict:
        self._change("update", other)
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        return dict, (dict(self),)


for _op in _LIST_CHANGES:
    setattr(HeldList, _op, lambda self, *a, _op=_op, **k: self._change(_op, *a, **k))
for _op in _DICT_CHANGES:
    setattr(HeldDict, _op, lambda self, *a, _op=_op, **k: self._change(_op, *a, **k))


def refusing(name: str, why: str) -> Callable[[Any], None]:
    """The ``on_change`` of a read-only held object: one sentence naming it, why, and what to do instead."""

    def refuse(_new: Any = None) -> None:
        raise ConfigError(f"GRPOTrainer.{name} cannot be changed: {why}")

    return refuse


READ_ONLY = {
    "reward_func_names": "they are the reward functions' names (a function's __name__, a reward model's folder), "
    "which name their metrics; rename the function (fn.__name__) before assigning reward_funcs",
    "reward_processing_classes": "they are read when the reward models are loaded; pass reward_processing_classes= "
    "to GRPOTrainer",
    "tools": "grpokit's episode loop takes them from the constructor; pass tools= to GRPOTrainer",
    "environment_factories": "grpokit's episode loop takes them from the constructor; pass environment_factory= "
    "to GRPOTrainer",
    "eos_token_ids": "the run's end-of-sequence ids (the tokenizer's and the model's generation_config's) are fixed "
    "when it is built; set the model's generation_config.eos_token_id before constructing the trainer",
    "generation_kwargs": "it is read from the GRPOConfig's sampling arguments; set them (and generation_kwargs=) in "
    "the GRPOConfig, or write generation_config's sampling fields, which grpokit reads at every batch",
}
"""The held objects grpokit cannot follow once built, and why (the second half of each refusal)."""


def read_only(name: str, items: Any) -> HeldList | HeldDict:
    """``items`` held read-only under ``name`` (a HeldDict for a dict, else a HeldList)."""
    refuse = refusing(name, READ_ONLY[name])
    return HeldDict(items, refuse) if isinstance(items, dict) else HeldList(items, refuse)


def refused_setter(name: str) -> Callable[[Any, Any], None]:
    """The setter of a read-only held attribute: assigning it is refused in the same sentence as a change."""

    def refuse(self: Any, value: Any) -> None:
        refusing(name, READ_ONLY[name])()

    return refuse


def _held(name: str) -> property:
    """A property reading ``_<name>`` (a read-only held object) whose assignment is refused in one sentence."""
    doc = f"TRL's {name} (read-only: {READ_ONLY[name]})."
    return property(lambda self: vars(self)[f"_{name}"], refused_setter(name), doc=doc)


def init(facade: Any, funcs: list, tools: Any, environment_factories: Any) -> None:
    """The read-only held objects TRL sets at construction: reward names and tokenizers, tools, factories."""
    from .surface import reward_names

    v = vars(facade)
    v["_reward_func_names"] = read_only("reward_func_names", reward_names(funcs))
    classes = [getattr(getattr(f, "scorer", None), "tokenizer", None) for f in funcs]
    v["_reward_processing_classes"] = read_only("reward_processing_classes", classes)
    v["_tools"] = read_only("tools", list(tools or []))
    v["_environment_factories"] = (
        None if environment_factories is None else read_only("environment_factories", environment_factories)
    )


def _eos_token_ids(self: Any) -> HeldList:
    """TRL's: every end-of-sequence id of the model's generation_config, the tokenizer's first when it is not
    among them (TRL's __init__); one read-only list per built run."""
    trainer = self._get()
    held = vars(self).get("_eos_held")
    if held is None or held[0] is not trainer:
        gen = getattr(getattr(trainer.model, "generation_config", None), "eos_token_id", None)
        ids = [] if gen is None else [gen] if isinstance(gen, int) else list(gen)
        eos = getattr(self._tokenizer, "eos_token_id", None)
        if eos is not None and eos not in ids:
            ids = [eos, *ids]
        held = vars(self)["_eos_held"] = (trainer, read_only("eos_token_ids", ids))
    return held[1]


PROPERTIES = {
    **{name: _held(name) for name in ("reward_func_names", "reward_processing_classes", "tools")},
    "environment_factories": _held("environment_factories"),
    "eos_token_ids": property(_eos_token_ids, refused_setter("eos_token_ids"), doc=_eos_token_ids.__doc__),
}
"""The read-only held attributes, installed on GRPOTrainer by attributes.install."""
