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
