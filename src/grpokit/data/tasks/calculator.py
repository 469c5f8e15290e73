"""The built-in multi-turn task: two-digit multiplication, with a calculator tool (``data.task=calculator``).

A problem is ``"57*68="``; the answer ``<answer>3876</answer>``. A product of two two-digit numbers
is hard to do in the head for a 0.26M-parameter model, and trivial with the ``calculator`` tool. An
episode that uses the tool looks like this (tag format, env/parse.py; the environment's tokens in
brackets are in the context, not in the loss)::

    57*68=<tool_call>57*68</tool_call>  [<tool_result>3876</tool_result>]  <answer>3876</answer><eos>
          ------------- turn 0 --------                                     ------- turn 1 -------

and one that answers from memory is a single turn, ``<answer>4200</answer><eos>``. The reward is
the arithmetic task's exact-match reward on the final answer (``arithmetic_accuracy``, which reads the
last message of the conversation). Splits are disjoint by construction, as in the arithmetic task:
a pair is held out iff ``crc32("a*b=") % 10 == 0``.

The shipped checkpoint (``assets/calc-demo-model/``, made by ``scripts/make_calc_demo_model.py``)
was warmed up on a teacher that calls the calculator on ``TOOL_PROB`` of the problems and otherwise
answers from memory with an estimate (both operands rounded to tens, ``estimate``), so greedy
decoding answers from memory (right only on multiples of ten) while sampling finds the tool in about
a third of the episodes: the reward has to teach the model to reach for the tool.
"""

from __future__ import annotations

import random
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpokit.env.builtin import calculator
from grpokit.env.parse import CALL_CLOSE, CALL_OPEN, RESULT_CLOSE, RESULT_OPEN

from .arithmetic import ANSWER_CLOSE, ANSWER_OPEN, drawn_rows, shuffled_rows, split_operand_pairs
from .demo_model import load_demo_model

OPERAND_MIN, OPERAND_MAX = 10, 99
HOLD_OUT_MODULUS = 10
TOOL_PROB = 0.3
"""Probability that the warm-up teacher calls the calculator instead of answering from memory."""
TAGS = (ANSWER_OPEN, ANSWER_CLOSE, CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE)
"""The single-token tags of the calc demo model's character tokenizer."""
CALC_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "calc-demo-model"


def format_prompt(a: int, b: int) -> str:
    """``format_prompt(57, 68) == "57*68="``."""
    return f"{a}*{b}="


def is_held_out(a: int, b: int) -> bool:
    return zlib.crc32(format_prompt(a, b).encode("ascii")) % HOLD_OUT_MODULUS == 0


@lru_cache(maxsize=None)
def _split_pairs() -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    return split_operand_pairs(OPERAND_MIN, OPERAND_MAX, is_held_out)


def train_pairs() -> tuple[tuple[int, int], ...]:
    return _split_pairs()[0]


def make_row(a: int, b: int) -> dict[str, str]:
    """``make_row(57, 68) == {"prompt": "57*68=", "answer": "3876"}``."""
    return {"prompt": format_prompt(a, b), "answer": str(a * b)}


def train_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` training rows drawn with replacement from the training pairs (deterministic in n, seed)."""
    return drawn_rows(train_pairs(), make_row, n, seed)


def held_out_rows(n: int | None = None, seed: int = 1234) -> list[dict[str, str]]:
    """The first ``n`` held-out rows (all when None) in a fixed shuffled order."""
    return shuffled_rows(_split_pairs()[1], make_row, n, seed)


def estimate(a: int, b: int) -> int:
    """The teacher's answer from memory: both operands rounded to tens (halves up), multiplied:
    ``estimate(57, 68) == 60 * 70 == 4200``. Right only when both operands are multiples of ten."""
    return (a + 5) // 10 * 10 * ((b + 5) // 10 * 10)


def teacher_episode(a: int, b: int, rng: random.Random, tool_prob: float = TOOL_PROB) -> list[tuple[str, bool]]:
    """One warm-up demonstration as ``(text, is_model_text)`` pieces (without EOS): a calculator
    call, its result (the environment's) and the answer; or an estimate from memory."""
    if rng.random() < tool_prob:
        return [
            (f"{CALL_OPEN}{a}*{b}{CALL_CLOSE}", True),
            (f"{RESULT_OPEN}{calculator(f'{a}*{b}')}{RESULT_CLOSE}", False),
            (f"{ANSWER_OPEN}{a * b}{ANSWER_CLOSE}", True),
        ]
    return [(f"{ANSWER_OPEN}{estimate(a, b)}{ANSWER_CLOSE}", True)]


def calc_model_path() -> Path:
    return CALC_MODEL_DIR


def load_calc_model(path: str | Path | None = None) -> tuple[Any, Any]:
    return load_demo_model(path or CALC_MODEL_DIR)
