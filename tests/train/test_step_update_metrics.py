"""A step of several optimizer updates logs one line (train/step_metrics.py:step_update_metrics)."""

import math

import pytest
import torch

from grpokit.train.step_metrics import step_update_metrics


def test_a_steps_updates_are_averaged_with_the_largest_norm_kept():
    """Two updates: loss 0.2 and -0.4 -> mean -0.1; grad_norm 1 and 3 -> mean 2, grad_norm/max 3; a clip ratio
    0 and 0.5 -> 0.25; the worst token's gap (…_max) 0.1 and 0.3 -> 0.3; learning_rate 1e-3 then 9e-4 -> the
    last, 9e-4 (in force after the step); skipped_nonfinite 0 and 1 -> 1 update skipped. Before: the last
    update's alone (loss -0.4, grad_norm 3, clip 0.5)."""
    first = {"loss": 0.2, "grad_norm": 1.0, "clip_ratio/region_mean": 0.0, "mismatch/logp_abs_diff_max": 0.1}
    first |= {"learning_rate": 1e-3, "skipped_nonfinite": 0.0}
    second = {"loss": -0.4, "grad_norm": 3.0, "clip_ratio/region_mean": 0.5, "mismatch/logp_abs_diff_max": 0.3}
    second |= {"learning_rate": 9e-4, "skipped_nonfinite": 1.0}
    m = step_update_metrics([first, second])
    assert math.isclose(m["loss"], -0.1)
    assert (m["grad_norm"], m["grad_norm/max"], m["clip_ratio/region_mean"]) == (2.0, 3.0, 0.25)
    assert (m["mismatch/logp_abs_diff_max"], m["learning_rate"], m["skipped_nonfinite"]) == (0.3, 9e-4, 1.0)


def test_one_update_is_its_own_line_and_none_is_empty():
    one = {"loss": 0.5, "grad_norm": 2.0, "learning_rate": 1e-3}
    assert step_update_metrics([one]) == {**one, "grad_norm/max": 2.0}
    assert step_update_metrics([]) == {}


def test_a_non_finite_norm_is_the_max():
    """A skipped update's NaN norm: the mean is NaN (the live non-finite alarm reads grad_norm) and so is the max."""
    m = step_update_metrics([{"grad_norm": 1.0}, {"grad_norm": float("nan")}])
    assert math.isnan(m["grad_norm"]) and math.isnan(m["grad_norm/max"])


def test_reward_std_is_the_mean_of_the_groups_population_std():
    """Two groups of 2: rewards [0, 1] (population std 0.5; Bessel's would be 0.707) and [1, 1] (0): mean 0.25, as
    docs/MONITORING.md defines reward_std (and domain/<d>/reward_std is computed)."""
    from types import SimpleNamespace

    from grpokit.train.step_metrics import sampling_metrics
    from helpers.pipeline_batches import scored

    sb, _ = scored([0.0, 1.0, 1.0, 1.0], 2, [2, 2, 2, 2])
    m = sampling_metrics(sb, SimpleNamespace(metrics={}), same_length_min_tokens=8)
    assert (m["reward"], m["reward_std"]) == (0.75, 0.25)


class _RankZeroOfTwo:
    """Rank 0 of a 2-rank job for job_rows: the other rank's rows and tags are fixed."""

    active = True

    def __init__(self, rows, tags):
        self.rows, self.tags = rows, tags

    def gather_rows(self, x):
        return torch.cat([x, self.rows.to(x.dtype)])

    def gather_objects(self, obj):
        return [obj, self.tags]


def test_reward_statistics_and_solved_groups_are_taken_over_every_ranks_rows():
    """Rank 0 holds one group of 2 that scored [0, 0]; rank 1 one group [1, 1] whose second completion failed
    (it holds failure_value 0 then, so its total is 0 too: [1, 0]).

    Over the job's rows the function scored 0, 0, 1 (the failure left out): mean 1/3, population std
    sqrt(((1/3)^2 * 2 + (2/3)^2) / 3) = sqrt(2/9) = 0.4714; rank 0's own rows would give mean 0, std 0. The
    job's best total is 1, so rank 0's all-zero group is not solved (its own best, 0, would call it solved)."""
    from types import SimpleNamespace

    from grpokit.train.step_metrics import job_rows, sampling_metrics
    from helpers.pipeline_batches import scored

    sb, _ = scored([0.0, 0.0], 2, [3, 4])
    # the other rank's rows as job_rows gathers them: total, the function's reward, failed (1.0), length
    other = torch.tensor([[1.0, 1.0, 0.0, 5.0], [0.0, 0.0, 1.0, 2.0]])
    rows = job_rows(sb, _RankZeroOfTwo(other, [None]))
    assert rows.lengths == [3, 4, 5, 2] and rows.failed_NF[:, 0].tolist() == [False, False, False, True]
    m = sampling_metrics(sb, SimpleNamespace(metrics={}), same_length_min_tokens=8, rows=rows)
    assert m["rewards/r/mean"] == pytest.approx(1 / 3)
    assert m["rewards/r/std"] == pytest.approx((2 / 9) ** 0.5)
    assert m["completions/frac_groups_solved"] == 0.0 and m["completions/reward_max"] == 1.0
    alone = sampling_metrics(sb, SimpleNamespace(metrics={}), same_length_min_tokens=8)  # one process: its own
    assert (alone["rewards/r/mean"], alone["rewards/r/std"], alone["completions/frac_groups_solved"]) == (0, 0, 1)
