"""Verifiers for vision-language tasks (VLM-R1, R1-V): box IoU, exact VQA answers, choice letters.

Boxes are read in the two common forms: ``[x1, y1, x2, y2]`` (four numbers in square brackets) and
Qwen2-VL's ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``. Like the text verifiers these are hedge-proof:
a completion that offers several boxes or several answers earns 0, so listing candidates never pays.
A completion without a box scores 0 and is counted (``rewards/no_box_fraction`` through
``log_metric``), never an exception. Answers inside ``<answer>...</answer>`` are preferred when present;
a blank or placeholder tag or box (``<answer></answer>``, ``<answer> answer here </answer>``,
grpokit.rewards.answers.is_placeholder) mentioned in the reasoning is not an answer and is dropped first;
when every tag and box is such, the answer slot was left empty: no answer (0), not the reasoning before it.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from .answers import left_empty, without_placeholders
from .math import completion_text

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_LIST_BOX = re.compile(r"\[" + ",".join([_NUM] * 4) + r"\]")
_QWEN_BOX = re.compile(
    r"<\|box_start\|>\s*\(" + _NUM + "," + _NUM + r"\)\s*,\s*\(" + _NUM + "," + _NUM + r"\)\s*<\|box_end\|>"
)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_LETTER = re.compile(r"(?<![A-Za-z])\(?([A-Z])\)?(?![A-Za-z])")


def parse_boxes(text: str) -> list[tuple[float, float, float, float]]:
    """Every box in ``text``, in either form: ``parse_boxes("[1, 2, 3, 4]") == [(1, 2, 3, 4)]``."""
    found = [m.groups() for m in _LIST_BOX.finditer(text)] + [m.groups() for m in _QWEN_BOX.finditer(text)]
    return [tuple(float(v) for v in g) for g in found]  # type: ignore[misc]


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``(x1, y1, x2, y2)`` boxes (corners in either order).

    Example: (0, 0, 2, 2) and (1, 1, 3, 3) overlap in a 1x1 square: 1 / (4 + 4 - 1) = 1/7."""
    ax1, ax2 = sorted((a[0], a[2]))
    ay1, ay2 = sorted((a[1], a[3]))
    bx1, bx2 = sorted((b[0], b[2]))
    by1, by2 = sorted((b[1], b[3]))
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def answer_part(text: str) -> str:
    """The one real `<answer>` tag's content; "" when every tag or box held no answer (the slot left empty:
    grpokit.rewards.answers.left_empty, the rule `final_answer` follows too); else the whole text."""
    kept = without_placeholders(text)  # "wrap it as <answer></answer>" is the format, not a second answer
    tagged = _ANSWER.findall(kept)
    if len(tagged) == 1:
        return tagged[0]
    return "" if left_empty(text, kept) else kept


def choice_letters(text: str) -> set[str]:
    """The capital letters a completion's answer names as choices: ``"(B)"`` gives {"B"}, ``"A or B"`` two."""
    return set(_LETTER.findall(answer_part(text)))


def count_numbers(text: str) -> list[str]:
    """The integers a completion's answer names, in order."""
    return re.findall(r"-?\d+", answer_part(text))


def box_iou_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float]:
    """IoU of the completion's one box with the gold box (``answer``: a box string or 4 numbers).
    No box, or more than one: 0 (hedge-proof); the share without any box is logged."""
    out, missing = [], 0
    for completion, gold in zip(completions, answer):
        boxes = parse_boxes(answer_part(completion_text(completion)))
        gold_box = parse_boxes(gold)[0] if isinstance(gold, str) else tuple(float(v) for v in gold)
        missing += not boxes
        out.append(box_iou(boxes[0], gold_box) if len(boxes) == 1 else 0.0)
    log = kwargs.get("log_metric")
    if log is not None and out:
        log("rewards/no_box_fraction", missing / len(out))
    return out


def normalize_answer(text: str) -> str:
    """Lower case, no articles, punctuation or extra spaces (the VQA evaluation's normalisation)."""
    text = re.sub(r"[^\w\s]", " ", str(text).lower())
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def vqa_accuracy(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float]:
    """1 when the normalised answer equals the normalised gold answer (or one of a list of them)."""
    out = []
    for completion, gold in zip(completions, answer):
        said = normalize_answer(answer_part(completion_text(completion)))
        golds = gold if isinstance(gold, (list, tuple)) else [gold]
        out.append(1.0 if said and said in {normalize_answer(g) for g in golds} else 0.0)
    return out


def count_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float]:
    """1 when the completion holds exactly one integer and it is the gold count; several numbers: 0."""
    out = []
    for completion, gold in zip(completions, answer):
        numbers = count_numbers(completion_text(completion))
        out.append(1.0 if len(numbers) == 1 and numbers[0] == str(gold).strip() else 0.0)
    return out


def choice_accuracy(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float]:
    """Multiple choice: 1 when the one capital letter given (``B``, ``(B)``) is the gold letter;
    two different letters ("A or B"): 0."""
    out = []
    for completion, gold in zip(completions, answer):
        letters = choice_letters(completion_text(completion))
        out.append(1.0 if len(letters) == 1 and letters == {str(gold).strip().strip("()").upper()} else 0.0)
    return out


def box_format(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Format reward: 1 when the completion holds exactly one box in a recognised form."""
    return [1.0 if len(parse_boxes(answer_part(completion_text(c)))) == 1 else 0.0 for c in completions]
