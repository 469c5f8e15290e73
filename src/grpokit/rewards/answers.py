"""The final answer of a completion, and whether it hedges. Pure text functions, no math-verify.

A policy trained against an answer checker learns to name several candidates ("3 or 4", two boxed
answers, a set, a range, a list on the last line) so that one of them matches. The rule here: **the
final answer is one answer**. `final_answer` finds it, in this order of precedence:

1. `<answer>...</answer>`: the last tag's content (a `\\boxed{}` inside it wins);
2. `\\boxed{...}` / `\\fbox{...}`: the last one;
3. a phrase "answer is X" / "answer: X": the last one, to the end of its line;
4. otherwise the last non-empty line, unless a tag or box was there and held no answer (below): then
   there is no answer (kind "none"), as for an empty completion.

Every answer of the chosen kind is a candidate: several tags, boxes or phrases that differ are a
hedge. Inside the chosen answer, `count_values` counts the values it names: items joined by commas,
semicolons, "or", "and", newlines, `\\lor`, `\\quad` (each item must look like a value: a number or
formula, maybe `x =` before it and a unit after; prose such as "Since x^2 = 9, x = 3" names one);
the elements of a set, tuple or interval; a range ("3 to 5", "between 3 and 5", "3-5", "3 < x < 5");
`\\pm` (two values). Thousands separators (1,000  1\\,000  1{,}000) are part of a number, not lists.
The checker (grpokit.rewards.math) scores 0 when the candidates disagree or the answer names more
values than the gold answer does, unless told that the gold answer is itself a set (`allow_multiple`).

Lines copied verbatim from the prompt (10 characters or more) are dropped first: an echo of the
question, or of an example answer in it, is not the model's answer. Then tags, boxes and phrases that
hold no answer are dropped (`without_placeholders`, `is_placeholder`): a blank one ("put it in
\\boxed{}", `<answer> </answer>`), one holding only a blank to fill (`...`, `___`), or a template's
own words ("answer here", "your final answer", `[answer]`). A policy that mentions the format while
reasoning is not hedging; a second *real* answer (any other content: a number, a letter, a word such as
"yes", a lone "?") stays a candidate, and a disagreeing one still scores 0. Dropping a placeholder never
makes an answer out of the reasoning: when no real tag, box or phrase remains, "6*7 = 42 <answer></answer>"
and "so 42 \\boxed{}" left their answer slot empty and have no answer, not the line before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_PHRASE = re.compile(r"answer\s*(?:is|:)\s*:?[ \t]*([^\n]+?)(?=\.(?:\s|$)|[ \t]*$)", re.IGNORECASE | re.MULTILINE)
_MIN_ECHO = 10  # a copied line shorter than this (a bare number) may well be the model's own answer

# Thousands separators: 1,000 / 1\,000 / 1{,}000 / 1\ 000 (three digits after, no more).
_THOUSANDS = re.compile(r"(?<=\d)(?:,|\\,|\{,\}|\\ |\u2009|\u202f)(?=\d{3}(?!\d))")
_WRAPPERS = re.compile(r"\\left|\\right|\\displaystyle|\\!|\$|\\\(|\\\)|\\\[|\\\]|\*\*")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
# \\ (a LaTeX line break) and arrows (\to, \Rightarrow ...) join two answers as surely as a comma does.
_SEPARATORS = re.compile(
    r"\s*(?:,|;|\n|\\\\|\\quad|\\qquad|\\lor|\\vee|\\cup|\\to\b|\\rightarrow\b|\\Rightarrow\b|"
    r"\\longrightarrow\b|\\implies\b|\\mapsto\b|->|→|\band/or\b|\bor\b|\band\b)\s*",
    re.IGNORECASE,
)
_EQUALS = re.compile(r"(?<![<>!=\\])=(?!=)")  # "=", not "<=", ">=", "!=", "=="
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_COMMA = re.compile(r"\s*[,;]\s*")
_RANGES = [
    re.compile(r"\bbetween\s+\S+\s+and\s+\S+", re.IGNORECASE),
    re.compile(r"\bfrom\s+\S+\s+to\s+\S+", re.IGNORECASE),
    re.compile(r"[\d}]\s+to\s+-?[\d\\]", re.IGNORECASE),
    re.compile(r"^\s*-?\d+(?:\.\d+)?\s*(?:-|–|—|\\text\{-\})\s*\d+(?:\.\d+)?\s*$"),
    re.compile(r"\d\s*(?:–|—|--)\s*\d"),
]
_RELATION = re.compile(r"\\le(?:q|qslant)?\b|\\ge(?:q|qslant)?\b|\\lt\b|\\gt\b|<=?|>=?|≤|≥")
_PLUS_MINUS = re.compile(r"\\pm|\\mp|±|∓")
_PREFIX = re.compile(r"^\s*(?:[A-Za-z](?:_\{?\w+\}?)?\s*(?:=|\\in)|\\in)\s*")
_UNIT_TAIL = re.compile(r"(?:\s+[A-Za-z°%]+\.?){1,3}\s*$")
_OPEN, _CLOSE = "([{", ")]}"


@dataclass(frozen=True)
class FinalAnswer:
    """What `final_answer` found: the answer span, its kind, and the other candidates of that kind."""

    text: str | None  # the chosen answer: a tag's content, "\\boxed{...}", a phrase's rest, or the last line
    kind: str  # "answer_tag", "boxed", "phrase", "last_line" or "none"
    others: list[str] = field(default_factory=list)  # answers of the same kind that read differently


def normalize_number_text(text: str) -> str:
    """Remove thousands separators (1,000 -> 1000, 1\\,000 -> 1000) so a number is one value."""
    return _THOUSANDS.sub("", text)


def _box_spans(text: str) -> list[tuple[int, int, int]]:
    """(start, content start, end) of every closed `\\boxed{...}` / `\\fbox{...}`, braces balanced, in the
    order they close (an inner box before its outer one); one pass over the text, however deep the nesting."""
    opens = {m.start(): m.end() for m in _BOX.finditer(text)}
    stack: list[tuple[int, int] | None] = []  # an open box (start, content start), or None for a plain "{"
    spans, i = [], 0
    while i < len(text):
        if i in opens:
            stack.append((i, opens[i]))
            i = opens[i]
            continue
        if text[i] == "{":
            stack.append(None)
        elif text[i] == "}" and stack:
            box = stack.pop()
            if box is not None:
                spans.append((box[0], box[1], i + 1))
        i += 1
    return spans


def boxed_contents(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` / `\\fbox{...}`, braces balanced, in order."""
    return [text[c : e - 1] for _, c, e in sorted(_box_spans(text))]


# A template's stand-in for the answer is made of these words only, "answer" among them; any other word
# ("yes", "x", "A") may be a real answer and is never taken for a placeholder.
_PLACEHOLDER_WORDS = frozenset({"your", "final", "the", "answer", "answers", "here", "goes"})
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad\b|~|\s")
_FILL_IN = re.compile(r"(?:\.|…|_|\\_|\\[lc]?dots\b|\\dotsc\b)+")


def is_placeholder(content: str) -> bool:
    """True when a tag's, box's or phrase's ``content`` holds no answer: blank (whitespace, LaTeX spacing,
    ``$``, boxes of such), only a blank to fill (``...``, ``\\ldots``, ``___``), or a template's words
    ("answer here", "your final answer", "[answer]", "\\text{answer}"; see ``_PLACEHOLDER_WORDS``). Brackets
    count only around such words: ``[]`` or ``\\{\\}`` may be a real (empty) answer, and ``?`` is one (a riddle's
    or a punctuation question's answer); it names no value, so it can hide no hedge."""
    bare = _SPACING.sub("", _WRAPPERS.sub("", content))
    if _BOX.search(bare):  # \\boxed{\\boxed{}}: a box of blank boxes is blank
        bare = re.sub(r"[{}]", "", _BOX.sub("", bare))
    if not bare or _FILL_IN.fullmatch(bare):
        return True
    plain = _BOX.sub(" ", _WRAPPERS.sub(" ", _TEXT_CMD.sub(r" \1 ", content)))
    words = re.sub(r"[\[\]<>(){}:.]", " ", plain).lower().split()
    return "answer" in words and set(words) <= _PLACEHOLDER_WORDS


def without_placeholders(text: str) -> str:
    """``text`` without the boxes and answer tags that hold no answer (``is_placeholder``): "put it in
    \\boxed{}" or "<answer> answer here </answer>" in the reasoning is the format, not a candidate."""
    pieces, done = [], 0
    for start, content, end in sorted(_box_spans(text)):
        if start >= done and is_placeholder(text[content : end - 1]):  # not inside a box already dropped
            pieces.append(text[done:start])
            done = end
    text = "".join(pieces) + text[done:]
    return _TAG.sub(lambda m: "" if is_placeholder(m.group(1)) else m.group(0), text)


def text_key(answer: str) -> str:
    """A loose normal form for telling answers apart as text: no spacing, wrappers, thousands separators or
    trailing period, lower case ("$1,000$." and "1000" are one)."""
    a = _WRAPPERS.sub("", normalize_number_text(answer))
    return re.sub(r"\s+|\\[,;: ]", "", a).rstrip(".").lower()


def left_empty(written: str, kept: str) -> bool:
    """True when a completion left its answer slot empty: ``kept`` (``without_placeholders(written)``) lost a
    tag or box that held no answer and holds no real tag or box. Such a completion has no answer (it is not
    the reasoning before the slot), wherever grpokit reads one: `final_answer`, the vision verifiers."""
    return kept != written and not _TAG.search(kept) and not _box_spans(kept)


def drop_echoed_lines(completion: str, prompt: str | None) -> str:
    """The completion without lines (stripped, >= 10 characters) that occur verbatim in the prompt."""
    if not prompt:
        return completion
    kept = [line for line in completion.splitlines() if len(line.strip()) < _MIN_ECHO or line.strip() not in prompt]
    return "\n".join(kept)


def final_answer(completion: str, prompt: str | None = None) -> FinalAnswer:
    """Find the completion's final answer and all candidates of its kind (see the module docstring)."""
    written = drop_echoed_lines(completion, prompt)
    text = without_placeholders(written)
    tags = _TAG.findall(text)
    if tags:
        answers = [(boxed_contents(t) or [t])[-1].strip() for t in tags]
        inner_boxes = boxed_contents(tags[-1])
        return _found(answers, "answer_tag", extra=inner_boxes)
    boxes = boxed_contents(text)
    if boxes:
        return _found([b.strip() for b in boxes], "boxed")
    phrases = [m.group(1).strip() for m in _PHRASE.finditer(text) if not is_placeholder(m.group(1))]
    if phrases:
        return _found(phrases, "phrase")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and not left_empty(written, text):
        return FinalAnswer(lines[-1], "last_line")
    return FinalAnswer(None, "none")


def _found(answers: list[str], kind: str, extra: Sequence[str] = ()) -> FinalAnswer:
    seen = {text_key(answers[-1]): answers[-1]}
    for a in [*answers, *extra]:
        seen.setdefault(text_key(a), a)
    return FinalAnswer(answers[-1], kind, list(seen.values())[1:])


def _split_top(text: str, sep: re.Pattern[str]) -> list[str]:
    """Split at `sep` matches that are outside every (), [] and {} pair."""
    depth, pieces, start, i = 0, [], 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and text[i + 1 : i + 2] in ("{", "}"):  # \{ \} are set braces: still nesting
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0:
            m = sep.match(text, i)
            if m and m.end() > i:
                pieces.append(text[start:i])
                start = i = m.end()
                continue
        i += 1
    pieces.append(text[start:])
    return [p.strip() for p in pieces if p.strip()]


def _bracketed(text: str) -> str | None:
    """The inside of `text` when one bracket pair ((), [], {}, \\{\\}) encloses all of it, else None."""
    t = text.strip()
    if t.startswith("\\{") and t.endswith("\\}"):
        inner = t[2:-2]
    elif len(t) >= 2 and t[0] in "([{" and t[-1] in ")]}":
        inner = t[1:-1]
    else:
        return None
    depth = 0
    for ch in inner:  # "(1)+(2)" is not enclosed by one pair
        depth += ch in _OPEN
        depth -= ch in _CLOSE
        if depth < 0:
            return None
    return inner if depth == 0 else None


def _value_like(piece: str) -> bool:
    """A number or formula, maybe with `x =` before it and up to three unit words after it."""
    p = _PREFIX.sub("", piece.strip().rstrip(".")).strip()
    if re.search(r"\d", p):
        p = _UNIT_TAIL.sub("", p)
    if not p or "=" in p:
        return False
    bare = re.sub(r"\\[A-Za-z]+", " ", p)  # \frac, \sqrt, \pi are formula, not prose
    return re.search(r"[A-Za-z]{2,}", bare) is None and re.fullmatch(r"[\s\w.+\-*/^(){}\[\]|%°'!,]*", bare) is not None


def count_values(answer: str) -> int:
    """How many values an answer span names: 1 for one answer, more for lists, sets, ranges, +-."""
    text = _TEXT_CMD.sub(lambda m: f" {m.group(1)} ", normalize_number_text(answer))
    text = re.sub(r"\beither\b", " ", _WRAPPERS.sub("", text), flags=re.IGNORECASE).strip().rstrip(".")
    if not text:
        return 0
    if any(r.search(text) for r in _RANGES) or len(_RELATION.findall(text)) >= 2:
        return 2
    numbers = {float(side) for side in _split_top(text, _EQUALS) if _NUMBER.fullmatch(side)}
    if len(numbers) >= 2:  # "5 = 6": two different numbers set equal name two answers, not one
        return 2
    extra = len(_PLUS_MINUS.findall(text))
    inner = _bracketed(_PREFIX.sub("", text))
    items = _split_top(inner, _COMMA) if inner is not None else []
    if len(items) >= 2:  # a set, tuple, list or interval: one value per element
        return len(items) + extra
    values = [p for p in _split_top(text, _SEPARATORS) if _value_like(p)]
    return max(1, len(values)) + extra
