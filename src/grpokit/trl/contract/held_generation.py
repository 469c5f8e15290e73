"""``generation_config``: one object, whose sampling fields grpokit's sampler reads at every batch, as TRL's.

TRL's transformers path hands ``self.generation_config`` to ``generate()`` at every generation batch, so a
subclass's ``self.generation_config.max_new_tokens = 64`` (or a callback's ``temperature`` schedule) samples
the next batch with it. grpokit samples with its own decode loop, which reads the six fields that loop
knows (``SAMPLED``) from the run's SamplingParams at every batch: written on the held GenerationConfig,
they become the sampler's from the next batch on (kept, and applied again, when the run is built anew). As
in TRL they change sampling only: the loss keeps the GRPOConfig's temperature and max_completion_length.
Every other field, and any field with vLLM or sampling worker processes (whose settings are fixed when
they start; TRL's vLLM path does not read generation_config either), is refused in one sentence. A copy
(``copy.deepcopy``, as ``generate()`` makes) is a plain GenerationConfig, the caller's own.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from transformers import GenerationConfig

from grpokit.config.sections import ConfigError

SAMPLED = {
    "max_new_tokens": "max_completion_length",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}
"""generation_config's fields grpokit's sampler reads at every batch -> the GRPOConfig argument they start as."""


class HeldGenerationConfig(GenerationConfig):
    """A GenerationConfig whose writes go to ``_on_write(name, value)`` (a per-trainer subclass holds it,
    outside the instance's ``__dict__``, which ``to_dict`` copies) before they are made."""

    _on_write: Any = None

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and (name not in vars(self) or vars(self)[name] != value):
            type(self)._on_write(name, value)
        super().__setattr__(name, value)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return GenerationConfig.from_dict, (self.to_dict(),)


def held_config(facade: Any, kwargs: dict) -> GenerationConfig:
    """TRL's GenerationConfig of ``kwargs`` (``generation_kwargs``), held for ``facade``: the fields written
    so far on it (or an earlier one of this trainer) applied."""
    plain = GenerationConfig(**kwargs, disable_compile=True)
    for name, value in facade._sampling_written.items():
        setattr(plain, name, value)
    cls = type(
        "GenerationConfig", (HeldGenerationConfig,), {"_on_write": staticmethod(lambda n, v: write(facade, n, v))}
    )
    plain.__class__ = cls
    return plain


def write(facade: Any, name: str, value: Any) -> None:
    """``trainer.generation_config.<name> = value``: a sampled field checked and made the sampler's from the next
    batch on; anything else refused in one sentence naming what to set instead."""
    where = f"GRPOTrainer.generation_config.{name}"
    if name not in SAMPLED:
        raise ConfigError(
            f"{where} is fixed when the run is built (grpokit samples with its own decode loop, which reads only "
            f"{', '.join(SAMPLED)} from generation_config at every batch); set it in the GRPOConfig "
            "(generation_kwargs for generate()'s other settings) instead"
        )
    r = facade.cfg.rollout
    if r.backend != "hf" or r.async_workers or r.async_remote_workers:
        raise ConfigError(
            f"{where} cannot change sampling with vLLM or sampling worker processes (they start with the "
            f"GRPOConfig's settings; TRL's vLLM path does not read generation_config); set {SAMPLED[name]}="
            f"{value!r} in the GRPOConfig instead"
        )
    facade._sampling_written[name] = _checked(where, name, value, r.max_new_tokens)
    if facade._trainer is not None:
        apply(facade, facade._trainer)


_VALID = {
    "temperature": (lambda v: v > 0, "a finite number > 0"),
    "top_p": (lambda v: v > 0, "a number > 0 (1 or more: off)"),
    "top_k": (lambda v: v >= -1 and v == int(v), "a whole number (0, -1 or None: off)"),
    "min_p": (lambda v: 0 <= v <= 1, "a number from 0 to 1 (0 or None: off)"),
    "repetition_penalty": (lambda v: v > 0, "a finite number > 0 (1: off)"),
}
"""What each sampled field may hold besides max_new_tokens (checked as the GRPOConfig argument it starts as)."""


def _checked(where: str, name: str, value: Any, longest: int) -> Any:
    """``value`` as the sampler takes it (None top_k / min_p: off), or one sentence naming what is valid."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if name == "max_new_tokens":
        ok = number and value == int(value) and 1 <= value <= longest
        valid = f"a whole number from 1 to max_completion_length ({longest}), which sizes the run"
    elif name in ("top_k", "min_p") and value is None:
        return value
    else:
        rule, valid = _VALID[name]
        ok = number and rule(value)
    if not ok:
        raise ConfigError(f"{where}={value!r} is not valid; give {valid}")
    return int(value) if name == "max_new_tokens" else value


def _params_of(written: dict[str, Any]) -> dict[str, Any]:
    """The written fields as SamplingParams' values (TRL's off values as grpokit's: top_p above 1, top_k -1 or
    None, min_p None)."""
    out = dict(written)
    if "top_p" in out:
        out["top_p"] = min(float(out["top_p"]), 1.0)
    if "top_k" in out:
        out["top_k"] = max(int(out["top_k"] or 0), 0)
    if "min_p" in out:
        out["min_p"] = float(out["min_p"] or 0.0)
    return out


def apply(facade: Any, trainer: Any) -> None:
    """The fields written so far become the built run's sampler settings (refused in one sentence where a
    subclass's _get_per_token_logps_and_entropies could not replay the truncated support they make)."""
    if not facade._sampling_written:
        return
    before = trainer.params
    trainer.params = replace(before, **_params_of(facade._sampling_written))
    if "_get_per_token_logps_and_entropies" in facade._overrides and trainer.replays_support:
        trainer.params = before
        raise ConfigError(
            "GRPOTrainer.generation_config's top_k / top_p / min_p would truncate sampling, whose support a "
            "subclass's _get_per_token_logps_and_entropies cannot replay for grpokit's pi_old pass; leave them off"
        )


def _generation_config(self: Any) -> GenerationConfig:
    """TRL's GenerationConfig of its transformers sampling path, one object per trainer: its sampling fields
    written are the sampler's from the next batch on (held_generation.py)."""
    held = vars(self).get("_generation_config")
    if held is None:
        held = vars(self)["_generation_config"] = held_config(self, dict(self.generation_kwargs))
    return held


def _set_generation_config(self: Any, value: Any) -> None:
    """A new GenerationConfig assigned: each field that differs from the held one's is written on it (the
    sampled ones honoured, any other refused in one sentence)."""
    if not isinstance(value, GenerationConfig):
        raise ConfigError(
            f"GRPOTrainer.generation_config must be a transformers GenerationConfig, got {type(value).__name__}"
        )
    held, new = self.generation_config, value.to_dict()
    old = held.to_dict()
    changed = [n for n, v in new.items() if n != "transformers_version" and old.get(n) != v]
    for name in sorted(changed, key=lambda n: n in SAMPLED):  # a refused field first: nothing half-applied
        setattr(held, name, new[name])


GENERATION_CONFIG = property(_generation_config, _set_generation_config, doc=_generation_config.__doc__)
