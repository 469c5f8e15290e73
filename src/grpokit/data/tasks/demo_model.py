"""The tiny causal LM that ships with grpokit, and the noisy teacher that made it.

``grpokit train`` with no arguments starts from this checkpoint (``assets/demo-model/``): a
standard ``LlamaForCausalLM`` small enough to train with GRPO on a laptop CPU in minutes, paired
with the character tokenizer of ``chartok.py``. ``scripts/make_demo_model.py`` regenerates it.

Why the checkpoint is deliberately imperfect
--------------------------------------------
A demo of reinforcement learning must show the reward teaching something the labels did not. The
warm-up data therefore comes from a *forgetful teacher*: on a problem whose column sums produce a
carry, the teacher writes the carry-free sum (each column added mod 10, carries discarded,
leading zeros dropped) with probability ``SLIP_PROB`` and the true sum otherwise::

    57+68:  true 125;  carry-free  (5+6) mod 10 = 1, (7+8) mod 10 = 5  ->  "15"

Because ``SLIP_PROB > 0.5``, a model that fits the teacher puts more mass on the wrong answer on
every carry problem: greedy decoding gets only the carry-free problems right (about a quarter of
them), while sampling at temperature 1 still finds the true sum ``1 - SLIP_PROB`` of the time. A
group of 8 samples therefore almost always contains both rewards 1 and 0, which is exactly the
signal GRPO needs, and raising greedy accuracy above 90% requires the policy to flip its preference,
something only the reward can ask for.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from .arithmetic import format_completion

SLIP_PROB = 0.65
"""Probability that the teacher drops every carry on a problem that has one."""
DEMO_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "demo-model"


def demo_model_path() -> Path:
    """Folder of the shipped checkpoint (config, safetensors weights, tokenizer files)."""
    return DEMO_MODEL_DIR


def load_demo_model(path: str | Path | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` loaded through the Auto classes from ``path`` (default: shipped copy)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path) if path is not None else DEMO_MODEL_DIR
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no demo model at {folder}; run `python scripts/make_demo_model.py` to build it")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    return model, tokenizer


def carry_free_sum(a: int, b: int) -> int:
    """Column-wise sum mod 10 with every carry discarded: ``carry_free_sum(57, 68) == 15``."""
    result, place = 0, 1
    while a or b:
        result += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return result


def has_carry(a: int, b: int) -> bool:
    """True when written addition of ``a`` and ``b`` produces at least one carry."""
    return carry_free_sum(a, b) != a + b


def teacher_completion(a: int, b: int, rng: random.Random, slip_prob: float = SLIP_PROB) -> str:
    """One noisy demonstration for ``a + b`` (without EOS), drawn from the forgetful teacher."""
    if has_carry(a, b) and rng.random() < slip_prob:
        return format_completion(carry_free_sum(a, b))
    return format_completion(a + b)
