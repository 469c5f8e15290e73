"""Every metric's rule over data-parallel ranks (record/rank_reduction.py): hand-worked combinations, and every
name grpokit writes has a declared rule (a new metric without one would fall to a guess)."""

import json
import math
import re

import pytest

from grpokit.record.rank_reduction import combine, rule_for
from helpers.paths import ROOT


def test_each_kind_of_metric_combines_by_its_rule():
    rank0 = {
        "rewards/f/failures": 1.0,  # counts: 1 + 2
        "rewards/scored": 8.0,
        "completions/max_length": 5.0,
        "completions/min_length": 2.0,
        "reward": 0.5,  # each rank's mean over its 8 completions: (0.5 + 1.0) / 2
        "rewards/f/std": 0.48,  # taken over every rank's rows already: rank 0's
        "time/step": 0.2,  # the slowest rank's
        "tools/call_frequency": 1.0,  # 8 episodes, 8 calls of which 25% failed
        "tools/failure_frequency": 0.25,
        "rollout/staleness": 1.0,
    }
    rank1 = {
        "rewards/f/failures": 2.0,
        "rewards/scored": 8.0,
        "completions/max_length": 7.0,
        "completions/min_length": 1.0,
        "reward": 1.0,
        "rewards/f/std": 0.48,
        "time/step": 0.3,
        "tools/call_frequency": 3.0,  # 8 episodes, 24 calls of which 50% failed
        "tools/failure_frequency": 0.5,
        "rollout/staleness": 2.0,
    }
    out = combine([rank0, rank1], [{"tokens": 10.0}, {"tokens": 30.0}])
    assert out["rewards/f/failures"] == 3.0 and out["rewards/scored"] == 16.0
    assert (out["completions/max_length"], out["completions/min_length"]) == (7.0, 1.0)
    assert out["reward"] == 0.75 and out["rewards/f/std"] == 0.48 and out["time/step"] == 0.3
    # failed calls over calls: (2 + 12) / (8 + 24) = 0.4375, not the mean of the rates (0.375)
    assert out["tools/failure_frequency"] == pytest.approx((1.0 * 0.25 + 3.0 * 0.5) / 4.0)
    assert out["rollout/staleness"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)  # per token: 1.75


def test_a_name_without_a_rule_and_a_metric_one_rank_lacks():
    # a reward function's own log_metric: the mean, or min / max by its name; a key only rank 1 has is kept
    out = combine(
        [{"my/score": 1.0, "my/len_max": 3.0}, {"my/score": 3.0, "my/len_max": 9.0, "gec/corrected_groups": 2}]
    )
    assert out == {"my/score": 2.0, "my/len_max": 9.0, "gec/corrected_groups": 2.0}
    assert combine([{"note": "text"}, {"note": "text"}]) == {}  # not a number: dropped


def test_min_and_max_skip_a_rank_that_had_no_value():
    # rank 0 clipped no sequence at all (NaN); rank 1's lowest share 0.2 is the job's, in either rank order
    nan = float("nan")
    assert combine([{"clip_ratio/low_min": nan}, {"clip_ratio/low_min": 0.2}]) == {"clip_ratio/low_min": 0.2}
    assert combine([{"clip_ratio/high_max": 0.5}, {"clip_ratio/high_max": nan}]) == {"clip_ratio/high_max": 0.5}
    assert math.isnan(combine([{"clip_ratio/low_min": nan}, {"clip_ratio/low_min": nan}])["clip_ratio/low_min"])
    # the same for a pooled part: a rank that covered values but had no clipped sequence (NaN) is skipped
    parts = [{"clip_ratio/low_min": nan, "weight/clip_ratio": 3}, {"clip_ratio/low_min": 0.4, "weight/clip_ratio": 2}]
    assert combine(parts) == {"clip_ratio/low_min": 0.4}


def test_a_weighted_rule_over_no_weight_is_a_mean_over_no_value():
    # no rank called a tool: the failure frequency is pooled as a part of 0 values a rank, 0.0 as a part's mean
    ranks = [{"tools/failure_frequency": 0.5, "tools/call_frequency": 0.0}] * 2
    assert combine(ranks)["tools/failure_frequency"] == 0.0


def _written_names() -> set[str]:
    """Metric names grpokit's step writes: every key of the recorded variants' metrics (tests/golden), and the
    names written as string literals in the stages' sources ({...} read as one path segment)."""
    names = set()
    for lines in json.loads((ROOT / "tests" / "golden" / "variant_metrics.json").read_text()).values():
        names |= {k for line in lines for k in line}
    literal = re.compile(r"""f?(["'])([a-z_]+(?:/[a-zA-Z_{}]+)+)\1""")
    src = ROOT / "src" / "grpokit"
    files = [p for d in ("algo", "rollout", "rewards", "train", "data", "env") for p in (src / d).rglob("*.py")]
    for path in files + [src / "record" / "signatures.py", src / "record" / "domain_metrics.py"]:
        names |= {re.sub(r"\{[^}]*\}", "x", m.group(2)) for m in literal.finditer(path.read_text())}
    # added after the reduction on rank 0 (health monitors, evaluations); a media type; the runner's per-kind
    # counts (f"rewards/{name}/{k}", checked on the runner's own output in the test below)
    # the loss's ``weight/<name>`` units, read by the update's accumulator and never written
    after = ("health/", "eval/", "application/", "rewards/x/x", "weight/")
    return {n for n in names if n != "step" and not n.startswith(after)}


def test_every_metric_grpokit_writes_has_a_rule():
    missing = sorted(n for n in _written_names() if rule_for(n) is None)
    assert not missing, f"metrics without a rule over ranks (record/rank_reduction.py RULES): {missing}"


def test_the_reward_runners_counts_are_summed():
    from grpokit.rewards.runner import RewardRunner
    from grpokit.rewards.spec import RewardSpec

    half = RewardSpec(fn=lambda prompts, completions, **kw: [1.0, "x"], name="half", weight=1.0)  # "x" fails
    with RewardRunner([half], num_workers=0, max_failure_fraction=1.0) as runner:
        metrics = runner.score(["p", "p"], ["a", "b"], [[1], [2]], 2).metrics
    per_function = [k for k in metrics if k.count("/") == 2]
    assert per_function and all(
        rule_for(k).how == ("same" if k.endswith(("/mean", "/std")) else "sum") for k in per_function
    ), {k: rule_for(k) for k in per_function}


# A stage's statistic of its own rank's rows, with its count beside it (``weight/``, algo/contexts.py part_weights):
# pooled exactly in the step's one reduction (moved here from algo/rank_stats.py's over_ranks).


def test_parts_are_pooled_by_their_counts():
    # rank 0 covers 1 value (2), rank 1 covers 3 values (4, 6, 8: mean 6, population std sqrt(8/3))
    s1 = math.sqrt(8 / 3)
    rank0 = {"a/mean": 2.0, "a/std": 0.0, "a/min": 2.0, "a/max": 2.0, "num_n": 1.0, "weight/a": 1, "weight/num_n": 1}
    rank1 = {"a/mean": 6.0, "a/std": s1, "a/min": 4.0, "a/max": 8.0, "num_n": 2.0, "weight/a": 3, "weight/num_n": 1}
    out = combine([rank0, rank1])
    # the four values 2, 4, 6, 8: mean 5, population variance (9 + 1 + 1 + 9) / 4 = 5
    assert out["a/mean"] == pytest.approx(5.0)
    assert out["a/std"] == pytest.approx(math.sqrt(5.0))  # = (1*(0 + 9) + 3*(8/3 + 1)) / 4 = 5 under the root
    assert (out["a/min"], out["a/max"], out["num_n"]) == (2.0, 8.0, 3.0)  # a num_ count: summed
    assert not any(k.startswith("weight/") for k in out)  # never written


def test_an_empty_part_leaves_the_extremes_and_weighs_nothing():
    # rank 1 covered no value: its _stats placeholders (0.0) must not become the job's min or pull the mean
    rank0 = {"x/mean": -1.0, "x/min": -3.0, "x/max": -1.0, "weight/x": 2}
    rank1 = {"x/mean": 0.0, "x/min": 0.0, "x/max": 0.0, "weight/x": 0}
    assert combine([rank0, rank1]) == {"x/mean": -1.0, "x/min": -3.0, "x/max": -1.0}
    empty = {"x/mean": 0.0, "weight/x": 0}
    assert combine([empty, empty]) == {"x/mean": 0.0}  # no value anywhere: _stats' 0


def test_a_part_overrides_its_rule_and_a_setting_keeps_its_own():
    # this rank: 2 groups, 1 flat, a ratio mean 1.5 over 10 tokens; the other: 2 groups, 0 flat, mean 3.0 over 30.
    # frac_reward_zero_std and num_zero_std_groups are "same" without a weight (the group estimator's, over every
    # rank's rows), parts with one (an estimator of this rank's groups: process, gigpo, gagpo, gtpo)
    groups = {"weight/frac_reward_zero_std": 2, "weight/num_zero_std_groups": 2}
    mine = {"frac_reward_zero_std": 0.5, "num_zero_std_groups": 1.0, "gigpo/r/mean": 1.5, "gigpo/r/max": 2.0}
    other = {"frac_reward_zero_std": 0.0, "num_zero_std_groups": 0.0, "gigpo/r/mean": 3.0, "gigpo/r/max": 4.0}
    mine |= {"distill/coef": 0.1, "weight/gigpo/r": 10, **groups}
    other |= {"distill/coef": 0.1, "weight/gigpo/r": 30, **groups}
    out = combine([mine, other])
    assert out["frac_reward_zero_std"] == 0.25  # 1 flat group of 4
    assert out["num_zero_std_groups"] == 1.0
    assert out["gigpo/r/mean"] == pytest.approx((10 * 1.5 + 30 * 3.0) / 40)  # 2.625
    assert out["gigpo/r/max"] == 4.0
    assert out["distill/coef"] == 0.1  # a setting: no count, its rule (same)
    # without the weights the same names are the job's figure already: rank 0's kept
    assert combine([{"num_zero_std_groups": 1.0}, {"num_zero_std_groups": 1.0}]) == {"num_zero_std_groups": 1.0}


def test_one_process_drops_the_weights_and_nothing_else():
    from grpokit.train.distributed import DistContext, reduce_metrics

    m = {"advantages/std": 0.3, "weight/advantages": 5.0}
    assert reduce_metrics(DistContext(), m) == {"advantages/std": 0.3}


def test_the_throughput_is_every_ranks_tokens_over_the_slowest_ranks_seconds():
    # rank 0: 100 tokens in 2 s (step), 1 s sampling; rank 1: 300 tokens in 4 s, 3 s sampling -> the job: 400
    # tokens over 4 s = 100 / s, and over the slowest sampling, 3 s: 133.3 / s; time/* the slowest rank's
    rank0 = {"tokens_per_second": 50.0, "rollout/tokens_per_second": 100.0, "time/step": 2.0, "time/sampling": 1.0}
    rank1 = {"tokens_per_second": 75.0, "rollout/tokens_per_second": 100.0, "time/step": 4.0, "time/sampling": 3.0}
    out = combine([rank0, rank1], [{"tokens": 100.0}, {"tokens": 300.0}])
    assert out["tokens_per_second"] == 100.0 and out["tokens_per_second"] * out["time/step"] == 400.0
    assert out["rollout/tokens_per_second"] == pytest.approx(400 / 3)
    # without time/sampling (the synchronous rollout): the trainer's rollout span, time/rollout
    sync = [
        {"rollout/tokens_per_second": 1.0, "time/rollout": 0.5},
        {"rollout/tokens_per_second": 1.0, "time/rollout": 2.0},
    ]
    assert combine(sync, [{"tokens": 100.0}, {"tokens": 300.0}])["rollout/tokens_per_second"] == 200.0


def test_one_naming_rule_for_extremes():
    from grpokit.record.rank_reduction import extreme

    assert [extreme(k) for k in ("a/max", "clip_ratio/low_min", "x/len_max", "grad_norm/max")] == [
        "max",
        "min",
        "max",
        "max",
    ]
    # a name merely ending in the letters is no extreme: the mean (rank_reduction's fallback read "endswith('max')")
    assert [extreme(k) for k in ("softmax", "my/admin", "maximum")] == [None, None, None]
    assert combine([{"my/softmax": 1.0}, {"my/softmax": 3.0}]) == {"my/softmax": 2.0}
