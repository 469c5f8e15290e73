"""rewards/values.py: one returned value checked, and one function's mean and std over what it scored."""

import math

import pytest
import torch

from grpokit.rewards.values import NonFiniteReward, check_value, value_stats


def test_a_value_is_a_float_none_or_an_error_and_nan_follows_the_convention():
    assert check_value(True) == 1.0 and check_value(3) == 3.0 and check_value(torch.tensor(0.25)) == 0.25
    assert check_value(None) is None and check_value(None, "trl") is None
    assert check_value(float("nan"), "trl") is None  # TRL's convention: NaN is None, not applicable
    with pytest.raises(NonFiniteReward, match="reward is nan"):  # grpokit's: the function's failure
        check_value(float("nan"))
    with pytest.raises(NonFiniteReward, match="reward is inf"):
        check_value(float("inf"), "trl")  # an infinity is a failure under either convention
    with pytest.raises(NonFiniteReward, match="does not fit in float32"):
        check_value(1e300)  # float32's largest is about 3.4e38
    with pytest.raises(NonFiniteReward, match="cannot be read as a float"):
        check_value(10**400)  # float() overflows
    with pytest.raises(TypeError, match="got str"):
        check_value("1")


def test_value_stats_leave_out_failed_and_not_applicable_items():
    values_N = torch.tensor([1.0, 3.0, float("nan"), 0.0])
    failed_N = torch.tensor([False, False, False, True])  # the 0.0 is a failure's failure_value
    # scored: 1 and 3 -> mean 2, population std sqrt(((1-2)^2 + (3-2)^2) / 2) = 1
    assert value_stats(values_N, failed_N, "f") == {"rewards/f/mean": 2.0, "rewards/f/std": 1.0}
    # failed_N None: the 0.0 counts -> (1 + 3 + 0) / 3 = 4/3
    assert value_stats(values_N, None, "f")["rewards/f/mean"] == pytest.approx(4 / 3)
    nothing = value_stats(torch.tensor([float("nan")]), None, "f")
    assert math.isnan(nothing["rewards/f/mean"]) and math.isnan(nothing["rewards/f/std"])
