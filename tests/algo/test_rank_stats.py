"""A job's statistics from every rank's part (algo/rank_stats.py), worked out by hand."""

import math

import pytest
import torch

from grpokit.algo.rank_stats import over_ranks, pool


def test_pool_weights_each_part_by_its_count():
    # rank 0 covers 1 value (2), rank 1 covers 3 values (4, 6, 8: mean 6, population std sqrt(8/3))
    s1 = math.sqrt(8 / 3)
    parts = [
        {"a/mean": (1, 2.0), "a/std": (1, 0.0), "a/min": (1, 2.0), "a/max": (1, 2.0), "n": (1, 1.0)},
        {"a/mean": (3, 6.0), "a/std": (3, s1), "a/min": (3, 4.0), "a/max": (3, 8.0), "n": (1, 2.0)},
    ]
    out = pool(parts, sums=("n",))
    # the four values 2, 4, 6, 8: mean 5, population variance (9 + 1 + 1 + 9) / 4 = 5
    assert out["a/mean"] == pytest.approx(5.0)
    assert out["a/std"] == pytest.approx(math.sqrt(5.0))  # = (1*(0 + 9) + 3*(8/3 + 1)) / 4 = 5 under the root
    assert (out["a/min"], out["a/max"], out["n"]) == (2.0, 8.0, 3.0)


def test_an_empty_part_leaves_the_extremes_and_weighs_nothing():
    # rank 1 covered no value: its _stats placeholders (0.0) must not become the job's min or pull the mean
    parts = [
        {"x/mean": (2, -1.0), "x/min": (2, -3.0), "x/max": (2, -1.0)},
        {"x/mean": (0, 0.0), "x/min": (0, 0.0), "x/max": (0, 0.0)},
    ]
    assert pool(parts) == {"x/mean": -1.0, "x/min": -3.0, "x/max": -1.0}
    assert pool([{"x/mean": (0, 0.0)}, {"x/mean": (0, 0.0)}]) == {"x/mean": 0.0}  # no value anywhere: _stats' 0


class TwoRanks:
    """Rank 0 of two: gather_rows puts the other rank's fixed part after this one's."""

    active = True

    def __init__(self, other: torch.Tensor):
        self.other = other

    def gather_rows(self, x):
        return torch.cat([x, self.other.to(x.dtype)[None]])


def test_over_ranks_gathers_the_parts_and_keeps_what_it_was_not_told_about():
    # this rank: 2 groups, 1 flat, a ratio mean 1.5 over 10 tokens; the other: 2 groups, 0 flat, mean 3.0 over 30
    mine = {"frac_reward_zero_std": 0.5, "num_zero_std_groups": 1.0, "r/mean": 1.5, "r/max": 2.0, "coef": 0.1}
    # the other rank's rows, in over_ranks' order (sorted keys): frac, num (a sum: count 1), r/max, r/mean
    other = torch.tensor([[2.0, 0.0], [1.0, 0.0], [30.0, 4.0], [30.0, 3.0]])
    out = over_ranks(mine, TwoRanks(other), {"frac_reward_zero_std": 2, "r": 10}, sums=("num_zero_std_groups",))
    assert out["frac_reward_zero_std"] == 0.25  # 1 flat group of 4
    assert out["num_zero_std_groups"] == 1.0
    assert out["r/mean"] == pytest.approx((10 * 1.5 + 30 * 3.0) / 40)  # 2.625
    assert out["r/max"] == 4.0
    assert out["coef"] == 0.1  # a setting: no count, left as it is


def test_one_process_is_unchanged():
    class One:
        active = False

    m = {"advantages/std": 0.3}
    assert over_ranks(m, One(), {"advantages": 5}) is m
