"""The per-step metrics of each domain (record/domain_metrics.py), on a hand-made scored batch."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from grpokit.record.domain_metrics import COLUMN, POOLED, domain_stats, domain_summary, pooled_evaluation
from grpokit.types import Prompt


def domain_metrics(sb, graders):
    """domain_stats over one scored batch's own rows (one process), as the trainer calls it."""
    tags = [p.columns.get(COLUMN) for p in sb.prompts]
    return domain_stats(tags, sb.total_N, sb.rewards_NF, sb.names, sb.rollout.model_lengths(), sb.group_size, graders)


def test_a_domains_accuracy_leaves_out_what_its_verifier_could_not_grade():
    """Two math prompts of G=2: the verifier gave 1 and 0 on the first, None (NaN: a gold that does not parse) on
    both completions of the second. Accuracy is over the graded: 1 of 2 = 0.5 (before: 1 of 4 = 0.25, the
    ungraded counted wrong). A domain whose verifier graded nothing has no accuracy (NaN), not 0."""
    prompts = [Prompt("a", [1], {"domain": "math"}), Prompt("b", [1], {"domain": "math"})]
    prompts += [Prompt("c", [1], {"domain": "code"})]
    nan = float("nan")
    # columns: math/accuracy, then code/tests (the code domain's first function: its verifier)
    rewards = torch.tensor([[1.0, nan], [0.0, nan], [nan, nan], [nan, nan], [nan, nan], [nan, nan]])
    sb = SimpleNamespace(
        prompts=prompts,
        group_size=2,
        total_N=torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        rewards_NF=rewards,
        names=["math/accuracy", "code/tests"],
        rollout=SimpleNamespace(model_lengths=lambda: [3, 4, 5, 6, 7, 8]),
    )
    m = domain_metrics(sb, {"math": "math/accuracy", "code": "code/tests"})
    assert m["domain/math/accuracy"] == 0.5 and m["domain/math/prompts"] == 2.0
    assert math.isnan(m["domain/code/accuracy"]) and m["domain/code/completion_length"] == 7.5


def test_a_domains_accuracy_is_read_from_its_grader_not_its_first_function():
    """One domain of G=4 whose functions are [tag_count, task] (weights 0.2, 1): tag_count gave 0 on every
    completion, the task's verifier 1, 0, 1, 1. The grader is the verifier (column add/arithmetic_accuracy):
    accuracy 3 of 4 = 0.75 (before: read from tag_count, the first function: 0.0). A domain missing from
    ``graders`` (its verifier not among its functions) gets no accuracy at all, the other metrics as ever."""
    prompts = [Prompt("a", [1], {"domain": "add"})]
    sb = SimpleNamespace(
        prompts=prompts,
        group_size=4,
        total_N=torch.tensor([1.0, 0.0, 1.0, 1.0]),
        rewards_NF=torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 1.0]]),
        names=["add/tag_count", "add/arithmetic_accuracy"],
        rollout=SimpleNamespace(model_lengths=lambda: [2, 2, 2, 2]),
    )
    assert domain_metrics(sb, {"add": "add/arithmetic_accuracy"})["domain/add/accuracy"] == 0.75
    m = domain_metrics(sb, {})
    assert "domain/add/accuracy" not in m and m["domain/add/reward"] == 0.75


def test_held_out_accuracy_over_domains_is_over_their_graded_prompts():
    """Domain A: 3 held-out prompts, its grader answered None on 2 (ungraded), graded 1 and got it right
    (accuracy 1.0, reward 1.0); B: 3 prompts, all graded, all wrong (0.0). Over every graded prompt the accuracy is
    (1 * 1.0 + 3 * 0.0) / (1 + 3) = 0.25 and the reward 0.25 (before: weighted by n, (3 * 1 + 3 * 0) / 6 = 0.5,
    the two ungraded prompts counted as if right); mean_length over all 6 prompts: (3 * 5 + 3 * 6) / 6 = 5.5;
    ungraded 2 + 0 = 2 (before: not pooled at all)."""
    a = {"accuracy": 1.0, "reward": 1.0, "n": 3.0, "ungraded": 2.0, "mean_length": 5.0}
    b = {"accuracy": 0.0, "reward": 0.0, "n": 3.0, "ungraded": 0.0, "mean_length": 6.0}
    out = domain_summary({"A": a, "B": b})
    assert {k: out[k] for k in ("accuracy", "reward", "mean_length", "n", "ungraded")} == {
        "accuracy": 0.25,
        "reward": 0.25,
        "mean_length": 5.5,
        "n": 6.0,
        "ungraded": 2.0,
    }
    assert out["domain/A/ungraded"] == 2.0 and out["domain/B/accuracy"] == 0.0


def test_a_domain_with_no_graded_prompt_leaves_the_others_accuracy_as_it_is():
    """A's grader graded none of its 3 prompts (accuracy and reward NaN), B graded 3 of 3 at 0.0. Over the graded
    prompts the accuracy is B's, 0 / 3 = 0.0 (before: NaN * 3 + 0 * 3 = NaN); lengths 4, 5, 5 and 6, 6, 6 give
    32 / 6; ungraded 3. With no domain graded at all, accuracy and reward are NaN, as for one set."""
    nan = float("nan")
    a = {"accuracy": nan, "reward": nan, "n": 3.0, "ungraded": 3.0, "mean_length": 14 / 3}
    b = {"accuracy": 0.0, "reward": 0.0, "n": 3.0, "ungraded": 0.0, "mean_length": 6.0}
    out = pooled_evaluation([a, b])
    assert out["accuracy"] == 0.0 and out["reward"] == 0.0 and out["ungraded"] == 3.0
    assert out["mean_length"] == pytest.approx(32 / 6)
    none = pooled_evaluation([a, dict(a)])
    assert math.isnan(none["accuracy"]) and math.isnan(none["reward"]) and none["n"] == 6.0
    assert pooled_evaluation([]) == {} and domain_summary({}) == {}


def test_pooling_sets_summaries_equals_summarising_their_prompts_as_one_set():
    """The rule of one held-out set (train/evaluate.py _summary) and the pooling of several sets' summaries
    agree: three sets' rewards (NaN: ungraded), summarised apart and pooled, give what the nine prompts give
    summarised together: graded rewards 1, 0, 0.5, 1, 0.25 -> reward 2.75 / 5 = 0.55, accuracy 2 / 5 = 0.4."""
    from grpokit.train.evaluate import _summary

    nan = float("nan")
    sets = [([1.0, nan, 0.0], [3, 4, 5]), ([nan, nan], [2, 2]), ([0.5, 1.0, 0.25, nan], [1, 6, 7, 8])]

    def summary(rewards, lengths):
        correct = [nan if r != r else float(r >= 1 - 1e-6) for r in rewards]
        return _summary([Prompt("p", [1])] * len(rewards), rewards, correct, lengths, [], [])

    whole = summary([r for s, _ in sets for r in s], [x for _, ls in sets for x in ls])
    pooled = pooled_evaluation([summary(*s) for s in sets])
    assert whole["reward"] == pytest.approx(0.55) and whole["accuracy"] == pytest.approx(0.4)
    assert set(pooled) == {k for k in whole if k in POOLED}  # every key of a set's summary but reward_<kind>
    for key in pooled:
        assert pooled[key] == pytest.approx(whole[key]), key
