"""A step of several optimizer updates logs one line (train/step_metrics.py:step_update_metrics)."""

import math

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
