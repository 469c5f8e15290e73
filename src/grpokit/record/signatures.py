"""Per-step signatures of a batch's groups, computed by the trainer for the health monitors.

- `group_signatures`: groups whose completions all share one length / one text (collapse and
  reward-hacking signatures; `same_length` and `same_text` monitors).
- `solved_signatures`: groups whose every completion earns the batch's best reward (a solved prompt; the
  whole job's batch under torchrun), so that the monitors can tell convergence from collapse (see
  grpokit.record.health).
"""

from __future__ import annotations


def group_signatures(
    texts: list[str],
    lengths: list[int],
    group_size: int,
    finish_reasons: list[str] | None = None,
    min_length: int = 0,
) -> dict[str, float]:
    """Fraction of groups whose G completions all share one length, and all share one text.

    `texts` and `lengths` are flat lists of N = P * G completions, grouped contiguously (completions
    0..G-1 answer prompt 0, and so on). Example with G = 2: texts ["a", "a", "b", "c"], lengths
    [3, 3, 2, 2] -> group 0 is one text and one length, group 1 two texts of one length ->
    {"completions/frac_groups_same_length": 1.0, "completions/frac_groups_same_text": 0.5}.

    With `finish_reasons` given, a group whose completions were all cut at the length limit
    ("length") does not count as sharing a length: that is truncation, which
    `completions/clipped_ratio` already shows, not a model that learned to hit one length.
    Groups whose shared length is below `min_length` tokens do not count either: short answers
    (a number, a label) share a length naturally; the hacking signature is long completions padded
    to one length.
    With G = 1 every "group" trivially agrees with itself, so both fractions are reported as 0.
    """
    n = len(texts)
    if len(lengths) != n or (finish_reasons is not None and len(finish_reasons) != n):
        raise ValueError(
            f"group_signatures: got {n} texts but {len(lengths)} lengths"
            + ("" if finish_reasons is None else f" and {len(finish_reasons)} finish reasons")
        )
    if group_size < 1 or n % group_size != 0:
        raise ValueError(f"group_signatures: {n} completions cannot be split into groups of {group_size}")
    groups = n // group_size
    if groups == 0 or group_size == 1:
        return {"completions/frac_groups_same_length": 0.0, "completions/frac_groups_same_text": 0.0}
    same_len = same_text = 0
    for g in range(groups):
        lo, hi = g * group_size, (g + 1) * group_size
        truncated = finish_reasons is not None and all(r == "length" for r in finish_reasons[lo:hi])
        same_len += len(set(lengths[lo:hi])) == 1 and not truncated and lengths[lo] >= min_length
        same_text += len(set(texts[lo:hi])) == 1
    return {
        "completions/frac_groups_same_length": same_len / groups,
        "completions/frac_groups_same_text": same_text / groups,
    }


def solved_signatures(
    texts: list[str], rewards: list[float], group_size: int, best: float | None = None
) -> dict[str, float]:
    """Which groups are solved: every completion earns the batch's best reward. For the health monitors.

    `texts` and `rewards` are flat lists of N = P * G completions grouped contiguously. Example with
    G = 2, texts ["a", "a", "b", "c", "d", "d"], rewards [1, 1, 1, 0, 0, 0]: best 1, worst 0; group 0
    is solved and one text, group 1 is not solved, group 2 is one text but not solved ->
    {"completions/reward_max": 1.0, "completions/reward_min": 0.0,
     "completions/frac_groups_solved": 1/3, "completions/frac_groups_same_text_solved": 1/3}.
    The monitors count a step's best as solved only when it equals the best reward of the whole run.
    ``best``: the batch's best when ``rewards`` are only a part of it (one rank's, under torchrun: a rank whose
    groups all scored 0 would otherwise count them solved); None: ``max(rewards)``.
    """
    n = len(texts)
    if len(rewards) != n:
        raise ValueError(f"solved_signatures: got {n} texts but {len(rewards)} rewards")
    if group_size < 1 or n % group_size != 0 or n == 0:
        raise ValueError(f"solved_signatures: {n} completions cannot be split into groups of {group_size}")
    top, groups = max(rewards) if best is None else max(best, max(rewards)), n // group_size
    tol = 1e-6 * max(1.0, abs(top))
    solved = same = 0
    for g in range(groups):
        lo, hi = g * group_size, (g + 1) * group_size
        if all(r >= top - tol for r in rewards[lo:hi]):
            solved += 1
            same += len(set(texts[lo:hi])) == 1
    return {
        "completions/reward_max": float(top),
        "completions/reward_min": float(min(rewards)),
        "completions/frac_groups_solved": solved / groups,
        "completions/frac_groups_same_text_solved": same / groups,
    }
