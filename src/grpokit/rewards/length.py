"""Length and repetition shaping. Lengths are completion token counts, len(completion_ids[i]).

- cosine_length (Yeo et al. 2025, "Demystifying Long Chain-of-Thought Reasoning in LLMs"):
  t = min(L, max_length) / max_length (clamped to [0, 1]), c = (1 + cos(pi * t)) / 2 (1 at L=0, 0 at
  max_length); correct: r = correct_long + (correct_short - correct_long) * c (1.0 -> 0.5: shorter
  correct answers earn more); wrong: r = wrong_long + (wrong_short - wrong_long) * c (-1.0 -> -0.5:
  short wrong answers are punished most). None when correctness is unknown. Bounded: a correct
  completion earns within [correct_long, correct_short], a wrong one within [wrong_short, wrong_long],
  whatever its length; the parameters must be finite and every correct value above every wrong one
  (correct_long > wrong_long, correct_short > wrong_long), so no length makes a wrong answer pay more
  than a right one.
- repetition_penalty (same paper): over words, n-grams of size n; r = max_penalty * (1 - unique /
  total); 0.0 when there are fewer than n words. Range [max_penalty, 0]. Words are compared after
  Unicode NFKC folding, case folding, removing invisible characters (zero-width spaces, soft hyphens)
  and stripping punctuation at their edges, so "the cat", "The  cat," and "the\u200bcat" repeat.
- length_penalty (Kimi k1.5, Kimi Team 2025), relative to the group: lam = 0.5 - (L - L_min) /
  (L_max - L_min) with L_min, L_max over the group; correct: r = lam; wrong: r = min(0, lam); 0.0 when
  all lengths in the group are equal. Range [-0.5, 0.5].
- overlong_penalty (DAPO, Yu et al. 2025, "soft overlong punishment"): with L_max = max_length and
  L_cache = cache_length: r = 0 if L <= L_max - L_cache; (L_max - L_cache - L) / L_cache if
  L_max - L_cache < L <= L_max (linear from 0 to -1); -1 if L > L_max.

Correctness for cosine_length and length_penalty comes from a boolean `correct` column when present,
else from math-verify against the `answer` / `solution` column (see grpokit.rewards.math).
"""

from __future__ import annotations

import functools
import math
import string
import unicodedata
from typing import Any

from .errors import ItemFailure
from .math import completion_text, correctness
from .spec import reads_group_size


def _lengths(completions: list[Any], completion_ids: list[list[int]] | None) -> list[int]:
    if completion_ids is None:
        raise ValueError("this reward needs completion_ids (token ids) to measure lengths in tokens.")
    return [len(ids) for ids in completion_ids]


def cosine_length(
    completions: list[Any],
    completion_ids: list[list[int]] | None = None,
    max_length: int = 1024,
    correct_short: float = 1.0,
    correct_long: float = 0.5,
    wrong_short: float = -1.0,
    wrong_long: float = -0.5,
    **kwargs: Any,
) -> list[float | None]:
    """Cosine length-scaled correctness; see the module docstring for the formula."""
    if max_length < 1:
        raise ValueError(f"cosine_length: max_length must be >= 1, got {max_length}.")
    values = (correct_short, correct_long, wrong_short, wrong_long)
    if not all(math.isfinite(v) for v in values) or min(correct_short, correct_long) <= wrong_long:
        raise ValueError(
            f"cosine_length: need finite values with correct_short and correct_long above wrong_long, "
            f"got correct_short={correct_short}, correct_long={correct_long}, "
            f"wrong_short={wrong_short}, wrong_long={wrong_long}."
        )
    out: list[float | None] = []
    for L, ok in zip(_lengths(completions, completion_ids), correctness(completions, kwargs)):
        if ok is None or isinstance(ok, ItemFailure):  # not applicable / the verifier failed (counted)
            out.append(ok)
            continue
        c = (1.0 + math.cos(math.pi * min(L, max_length) / max_length)) / 2.0
        short, long = (correct_short, correct_long) if ok else (wrong_short, wrong_long)
        out.append(long + (short - long) * c)
    return out


@functools.lru_cache(maxsize=1)
def _invisible() -> dict[int, None]:
    """Unicode format characters (zero-width spaces and joiners, soft hyphen ...): removed before counting."""
    return dict.fromkeys(i for i in range(0x110000) if unicodedata.category(chr(i)) == "Cf")


_EDGE_PUNCT = string.punctuation + "\u2018\u2019\u201c\u201d\u2026\u00ab\u00bb\u2013\u2014"


def _words(text: str) -> list[str]:
    """Words for repetition counting: NFKC, case-folded, invisible characters removed, edge punctuation off."""
    text = unicodedata.normalize("NFKC", text).translate(_invisible()).casefold()
    return [w for w in (w.strip(_EDGE_PUNCT) for w in text.split()) if w]


def repetition_penalty(
    completions: list[Any], ngram_size: int = 3, max_penalty: float = -1.0, **kwargs: Any
) -> list[float]:
    """max_penalty * (1 - distinct n-grams / all n-grams) over whitespace-split words."""
    if ngram_size < 1 or max_penalty > 0:
        raise ValueError(
            f"repetition_penalty: need ngram_size >= 1 and max_penalty <= 0, got {ngram_size} and {max_penalty}."
        )
    out = []
    for c in completions:
        words = _words(completion_text(c))
        grams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
        out.append(max_penalty * (1.0 - len(set(grams)) / len(grams)) if grams else 0.0)
    return out


@reads_group_size  # its groups are G completions, also in TRL's one call per batch (rewards/spec.py)
def length_penalty(
    completions: list[Any], completion_ids: list[list[int]] | None = None, group_size: int | None = None, **kwargs: Any
) -> list[float | None]:
    """Kimi k1.5 length reward relative to the group's shortest and longest completion."""
    lengths = _lengths(completions, completion_ids)
    correct = correctness(completions, kwargs)
    g = group_size or len(lengths)
    out: list[float | None] = []
    for start in range(0, len(lengths), g):
        group = lengths[start : start + g]
        lo, hi = min(group), max(group)
        for L, ok in zip(group, correct[start : start + g]):
            lam = 0.0 if hi == lo else 0.5 - (L - lo) / (hi - lo)
            out.append(ok if ok is None or isinstance(ok, ItemFailure) else (lam if ok else min(0.0, lam)))
    return out


def overlong_penalty(
    completions: list[Any],
    completion_ids: list[list[int]] | None = None,
    max_length: int = 1024,
    cache_length: int = 256,
    **kwargs: Any,
) -> list[float]:
    """DAPO soft overlong punishment on token counts; see the module docstring for the formula."""
    if not 0 < cache_length <= max_length:
        raise ValueError(f"overlong_penalty: need 0 < cache_length <= max_length, got {cache_length} and {max_length}.")
    start = max_length - cache_length
    out = []
    for L in _lengths(completions, completion_ids):
        if L <= start:
            out.append(0.0)
        elif L <= max_length:
            out.append((start - L) / cache_length)  # DAPO: linear from 0 to -1 over the cache
        else:
            out.append(-1.0)
    return out
