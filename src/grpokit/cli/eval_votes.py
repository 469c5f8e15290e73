"""What each sample votes for in ``grpokit eval``'s maj@k: the answer its grader reads, pooled as the grader pools.

Self-consistency (Wang et al. 2022) takes the most frequent *parsed final answer* among k samples, equivalent
answers counted together. Here a sample's vote is the answer the grading function itself reads:

- every sample the grader gave full reward is one vote, for the gold answer, whatever form it took (0.5, 1/2
  and \\dfrac12 against the gold 1/2): the grader's verdict already says they are the same answer;
- every other sample votes with the answer its grader reads, keyed as that grader compares answers:

    math_accuracy            the final answer math_accuracy reads (grpokit.rewards.answers.final_answer, lines
                             echoed from the prompt dropped), keyed by value (grpokit.rewards.answer_keys)
    arithmetic_accuracy      the first <answer> tag as written (the arithmetic and calculator tasks' exact rule)
    reasoning_gym_accuracy   the final answer as text (answers.text_key)
    vqa_accuracy, choice_accuracy, count_accuracy   their normalised answer, letters, integers
    any other function       the final answer as text; the output says so, as grpokit cannot know how a
    (module:function)        function of the user's reads an answer

- a sample without an answer (its tag or box left blank, answers.left_empty; no tag, or a blank one, for
  arithmetic) casts no vote: a grader's reading that is empty text is no answer, whichever grader reads it;
- a sample the grader marked right and one it marked wrong are never one vote, even when they read alike
  (a hedge whose last box is the gold scores 0), so the winning vote's grade is well defined.

Graders that read no one answer (the code tests, box IoU, the format and length rewards, the shapes task's
verifier) have no maj@k: it is null in the JSON and "-" in the table, and ``maj_votes_on`` says why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from grpokit.rewards.answers import final_answer, text_key
from grpokit.rewards.spec import reward_name

RIGHT = "right"  # every sample the grader gave full reward: one vote, for the gold answer


@dataclass(frozen=True)
class Votes:
    """How the samples graded by one function vote."""

    reads: str
    """What a vote is, in words: the output's ``maj_votes_on``."""
    keys: Callable[[list[str], list[str | None]], list[Hashable | None]] | None
    """(completion texts, their prompts' texts) -> one key per completion, equal keys one vote, None (or "", an
    empty reading) no vote; None: the grader reads no one answer, so there is no maj@k."""


def _final_text(texts: list[str], prompts: list[str | None]) -> list[Hashable | None]:
    found = (final_answer(t, p).text for t, p in zip(texts, prompts))
    return [None if a is None else text_key(a) for a in found]


def _math_values(texts: list[str], prompts: list[str | None]) -> list[Hashable | None]:
    from grpokit.rewards.answer_keys import answer_keys

    return list(answer_keys([final_answer(t, p) for t, p in zip(texts, prompts)]))


def _each(read: Callable[[str], Hashable | None]) -> Callable[[list[str], list[str | None]], list[Hashable | None]]:
    return lambda texts, prompts: [read(t) for t in texts]


@functools.cache
def _registry() -> dict[Callable, Votes]:
    """Each known grading function's votes (imported here, once: eval's own table of graders)."""
    from grpokit.data.tasks import arithmetic, reasoning_gym, shapes
    from grpokit.rewards import grounding
    from grpokit.rewards.math import math_accuracy
    from grpokit.rewards.spec import BUILTINS, resolve_reward

    answers = {
        math_accuracy: Votes("math_accuracy's final answer, equal values pooled (0.5 = 1/2)", _math_values),
        arithmetic.arithmetic_accuracy: Votes(
            "the first <answer> tag, as arithmetic_accuracy reads it", _each(arithmetic.extract_answer)
        ),
        reasoning_gym.reasoning_gym_accuracy: Votes("the final answer, as text", _final_text),
        grounding.vqa_accuracy: Votes(
            "the answer as vqa_accuracy normalises it",
            _each(lambda t: grounding.normalize_answer(grounding.answer_part(t))),
        ),
        grounding.choice_accuracy: Votes(
            "the letters named, as choice_accuracy reads them",
            _each(lambda t: "".join(sorted(grounding.choice_letters(t)))),
        ),
        grounding.count_reward: Votes(
            "the integers named, as count_accuracy reads them",
            _each(lambda t: ",".join(grounding.count_numbers(t))),
        ),
    }
    no_answer = {resolve_reward(name) for name in BUILTINS} - set(answers) | {shapes.shapes_reward}
    return {**{fn: Votes(f"none: {fn.__name__} grades no one answer", None) for fn in no_answer}, **answers}


def votes_of(fn: Callable) -> Votes:
    """How the samples ``fn`` grades vote (the module docstring); a function grpokit does not know votes with
    its final answer as text, which ``reads`` says."""
    while isinstance(fn, functools.partial):  # reward.params bound to it
        fn = fn.func
    known = _registry().get(fn)
    if known is not None:
        return known
    name = reward_name(fn)
    return Votes(f"the final answer as text (grpokit does not know how {name} reads an answer)", _final_text)


def vote_keys(
    votes: Votes, texts: Sequence[str], prompts: Sequence[str | None], correct: Sequence[bool | None]
) -> list[Hashable | None]:
    """One vote per sample (the module docstring): ``RIGHT`` for those the grader gave full reward, the key of
    its answer for the others (None: no vote, also where the reading is empty text, a blank slot such as
    ``<answer></answer>``). Only the wrong samples are read."""
    if votes.keys is None:
        return [None] * len(texts)
    wrong = [i for i, ok in enumerate(correct) if not ok]
    keys = votes.keys([texts[i] for i in wrong], [prompts[i] for i in wrong])
    out: list[Hashable | None] = [RIGHT] * len(texts)
    for i, key in zip(wrong, keys):
        out[i] = None if key is None or key == "" else ("wrong", key)
    return out
