"""Reward edges under grpokit.trl, checked by hand and against TRL 1.16's own run where TRL runs them: a
function returning NaN (TRL reads it as None), functions that are callable objects or functools.partial
(named as TRL names them: one name for reward_func_names, the metrics and ``_logs``), ``_logs["advantages"]``
(the advantages trained, as TRL logs them) and a failed item left out of its function's logged mean and std."""

from __future__ import annotations

import functools
import math

import pytest
from datasets import Dataset

from helpers.trl_models import small_args

NAN = float("nan")
# two prompts x G=4, values by position in the batch (grpokit.trl calls each function once per batch, as TRL)
F = [1.0, NAN, 3.0, 0.5, NAN, NAN, 2.0, 2.0]
G = [0.0, 1.0, 1.0, 1.0, NAN, 2.0, 2.0, 5.0]
DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])


class Positional:
    """A callable object: TRL names it after its class."""

    def __call__(self, completions, **kwargs):
        return list(F)


def by_position(completions, values, **kwargs):
    return list(values)


def _run(lib, model: str, funcs, out, **kw):
    """One step of ``lib``'s GRPOTrainer (grpokit.trl or trl) on the two prompts: 8 completions by default."""
    args = small_args(
        lib.GRPOConfig,
        out,
        **{"max_steps": 1, "per_device_train_batch_size": 8, "report_to": "none", "save_strategy": "no", **kw},
    )
    trainer = lib.GRPOTrainer(model, reward_funcs=funcs, train_dataset=DATA, args=args)
    trainer.train()
    return trainer


def test_nan_rewards_names_and_logged_advantages_as_trl(chat_model, tmp_path):
    import grpokit.trl as ours

    funcs = [Positional(), functools.partial(by_position, values=G)]
    tr = _run(ours, chat_model, funcs, tmp_path / "ours")
    entry = tr.state.log_history[0]
    # one name each, TRL's rule: the class of a callable object, the function a partial binds
    assert tr.reward_func_names == ["Positional", "by_position"] and list(tr._logs["rewards"]) == tr.reward_func_names
    # NaN is None: F's values 1, 3, 0.5, 2, 2 -> mean 1.7, Bessel std sqrt(3.8 / 4); G's 0, 1, 1, 1, 2, 2, 5 ->
    # mean 12/7; totals (nansum) 1, 1, 4, 1.5 | unscorable, 2, 4, 7 -> reward 20.5 / 7 over the 7 scored
    assert entry["rewards/Positional/mean"] == pytest.approx(1.7)
    assert entry["rewards/by_position/mean"] == pytest.approx(12 / 7)
    assert entry["rewards/Positional/std"] == pytest.approx(math.sqrt(0.95))
    assert entry["reward"] == pytest.approx(20.5 / 7)
    assert entry["rewards/Positional/failures"] == 0.0 and entry["rewards/Positional/not_applicable"] == 3.0
    # the advantages trained: group 1 mean 1.875, Bessel std sqrt(6.1875 / 3) = 1.43614; group 2 over 2, 4, 7:
    # mean 13/3, std sqrt(12.667 / 2) = 2.51661; (r - mean) / (std + 1e-4); the unscorable completion gets 0
    want = [-0.60923, -0.60923, 1.47956, -0.26110, 0.0, -0.92713, -0.13245, 1.05959]
    assert list(tr._logs["advantages"]) == pytest.approx(want, abs=1e-4)
    trl = pytest.importorskip("trl")
    theirs = _run(trl, chat_model, [Positional(), functools.partial(by_position, values=G)], tmp_path / "trl")
    assert theirs.reward_func_names == tr.reward_func_names
    assert list(theirs._logs["advantages"]) == pytest.approx(list(tr._logs["advantages"]), abs=1e-4)
    t = theirs.state.log_history[0]
    for key in (
        "rewards/Positional/mean",
        "rewards/Positional/std",
        "rewards/by_position/mean",
        "reward",
        "reward_std",
    ):
        assert entry[key] == pytest.approx(t[key], abs=1e-5), key


def scaled_advantages(completions, **kwargs):
    return [1.0, 2.0, 3.0, 6.0][: len(completions)]


def test_logged_advantages_follow_scale_rewards(chat_model, tmp_path):
    """scale_rewards="none": the advantage is r - mean, 1 2 3 6 -> mean 3: -2, -1, 0, 3 (with the default group
    scaling they are divided by the Bessel std sqrt(14 / 3) = 2.16025 (+ 1e-4): -0.92578, -0.46289, 0, 1.38866).
    Before, ``_logs["advantages"]`` was always r - mean, whatever scaling trained."""
    import grpokit.trl as ours

    args = dict(per_device_train_batch_size=4)
    group = _run(ours, chat_model, [scaled_advantages], tmp_path / "group", **args)
    assert list(group._logs["advantages"]) == pytest.approx([-0.92578, -0.46289, 0.0, 1.38866], abs=1e-4)
    plain = _run(ours, chat_model, [scaled_advantages], tmp_path / "none", scale_rewards="none", **args)
    assert list(plain._logs["advantages"]) == pytest.approx([-2.0, -1.0, 0.0, 3.0])


def one_fails(completions, **kwargs):
    return [2.0, math.inf, 4.0, 0.0]  # an infinity is a failure in either convention: failure_value 0


def test_a_failed_item_is_left_out_of_its_functions_logged_mean_and_std(chat_model, tmp_path):
    """docs/REWARDS.md: a failed item gets failure_value in the total but is no value of the function. Values
    2, 4, 0 -> mean 2, Bessel std sqrt((0 + 4 + 4) / 2) = 2 (counted as 0, the mean was 1.5); metrics.jsonl's
    grpokit mean says the same."""
    import json

    import grpokit.trl as ours

    tr = _run(ours, chat_model, [one_fails], tmp_path / "run", per_device_train_batch_size=4)
    entry = tr.state.log_history[0]
    assert entry["rewards/one_fails/failures"] == 1.0
    assert entry["rewards/one_fails/mean"] == pytest.approx(2.0)
    assert entry["rewards/one_fails/std"] == pytest.approx(2.0)
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["rewards/one_fails/mean"] == pytest.approx(2.0)
