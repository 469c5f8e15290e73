"""The per-step metrics of each domain (record/domain_metrics.py), on a hand-made scored batch."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from grpokit.record.domain_metrics import COLUMN, domain_stats
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
