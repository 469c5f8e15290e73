"""Evaluation estimators over n sampled answers per prompt: pass@k, maj@k and mean@k.

    pass@k   probability that at least one of k samples is correct. Computed with the unbiased
             estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
             HumanEval): from n >= k samples of which c are correct,
                 pass@k = 1 - C(n - c, k) / C(n, k)
             i.e. one minus the chance that k samples drawn without replacement are all wrong. The
             binomials overflow floats for large n, so we use the product form of the same ratio:
                 C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)
    maj@k    majority vote ("self-consistency", Wang et al. 2022): take the first k answers, drop the
             unparsable ones (None), pick the most frequent answer and score whether it is correct.
             An answer here is a vote key: the caller makes answers the grader takes for one equal
             (grpokit eval: 0.5, 1/2 and \\frac12 are one key, cli/eval_votes.py), else equivalent
             answers split their votes. Tie rule: among answers with the same top count, the one that
             appears first wins, so the result is deterministic and does not depend on hashing order;
             the samples are drawn independently, so the first of the tied is a fair draw among them.
    mean@k   mean score of the first k samples (avg@k in some papers); with 0/1 scores it equals the
             expected pass@1 measured on k samples.

All functions are pure; `summarize` averages them over prompts into {"pass@1": ..., "maj@8": ...}.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021).

    Example: n=5, c=2, k=2 -> 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
             (product form: 1 - (1 - 2/4)(1 - 2/5) = 1 - 0.5 * 0.6 = 0.7).
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k} with n={n} samples")
    if n - c < k:  # fewer wrong samples than k: every draw of k contains a correct one
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """1.0 if the majority answer among the first k samples is correct, else 0.0.

    `answers[i]` is sample i's vote, its final answer as a key (None when it has none; it does not vote),
    and `correct[i]` whether sample i was graded correct. Equal keys must be graded alike (grpokit eval
    keys a right and a wrong sample apart); the first sample carrying the winning key decides. Ties go
    to the key seen first. Example: answers ["7", "5", "5", "7"], k=4 -> tie 2:2, "7" came first -> its grade.
    """
    if len(answers) != len(correct):
        raise ValueError(f"maj_at_k: {len(answers)} answers but {len(correct)} correctness flags")
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj_at_k needs 1 <= k <= {len(answers)} (number of samples), got k={k}")
    counts: dict[Hashable, int] = {}
    first: dict[Hashable, int] = {}
    for i, answer in enumerate(answers[:k]):
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        first.setdefault(answer, i)
    if not counts:
        return 0.0  # nothing parsable: no majority answer, counted as wrong
    winner = max(counts, key=lambda a: (counts[a], -first[a]))  # most votes, then earliest
    return 1.0 if correct[first[winner]] else 0.0


def mean_at_k(scores: Sequence[float], k: int) -> float:
    """Mean of the first k scores. Example: [1, 0, 1, 1], k=2 -> (1 + 0) / 2 = 0.5."""
    if not 1 <= k <= len(scores):
        raise ValueError(f"mean_at_k needs 1 <= k <= {len(scores)} (number of samples), got k={k}")
    return sum(float(s) for s in scores[:k]) / k


def summarize(
    answers_per_prompt: Sequence[Sequence[Hashable | None]],
    correct_per_prompt: Sequence[Sequence[bool]],
    ks: Sequence[int] = (1,),
) -> dict[str, float]:
    """Average pass@k, maj@k and mean@k over prompts: {"pass@1": .., "maj@1": .., "mean@1": .., ...}.

    pass@k uses all n samples of a prompt (that is what makes it unbiased); maj@k and mean@k use the
    first k. Every prompt needs at least max(ks) samples.
    """
    if len(answers_per_prompt) != len(correct_per_prompt):
        raise ValueError(
            f"summarize: {len(answers_per_prompt)} prompts of answers but {len(correct_per_prompt)} of grades"
        )
    if not correct_per_prompt:
        raise ValueError("summarize: no prompts to evaluate")
    fewest = min(len(c) for c in correct_per_prompt)
    if max(ks) > fewest:
        raise ValueError(
            f"summarize: k={max(ks)} needs at least {max(ks)} samples per prompt, but one prompt has {fewest}"
        )
    out: dict[str, float] = {}
    p = len(correct_per_prompt)
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(len(c), sum(bool(x) for x in c), k) for c in correct_per_prompt) / p
        out[f"maj@{k}"] = sum(maj_at_k(a, c, k) for a, c in zip(answers_per_prompt, correct_per_prompt)) / p
        out[f"mean@{k}"] = sum(mean_at_k([float(bool(x)) for x in c], k) for c in correct_per_prompt) / p
    return out
