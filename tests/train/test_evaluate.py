"""Held-out evaluation counts only what it can grade: a prompt whose gold does not parse is left out of
accuracy and reward and counted as ``ungraded``, never scored wrong; held-out golds are checked at load."""

import math

import pytest

from grpokit.config import Config
from grpokit.config.sections import ConfigError
from grpokit.train.evaluate import _summary
from grpokit.train.run_data import check_gold_answers
from grpokit.types import Prompt


def test_an_ungraded_prompt_is_left_out_of_accuracy_and_reward_and_counted():
    prompts = [Prompt(text=str(i), ids=[i], columns={"kind": k}) for i, k in enumerate(["a", "a", "b", "b"])]
    nan = float("nan")
    out = _summary(prompts, [1.0, nan, 0.5, 0.0], [1.0, nan, 0.0, 0.0], [2, 4, 6, 8], [], [])
    # graded: prompts 0, 2, 3 -> accuracy 1/3 (only prompt 0 has full reward), reward (1 + 0.5 + 0) / 3 = 0.5;
    # before, the NaN counted 0: accuracy 1/4, reward 1.5/4. Lengths are every prompt's: 20 / 4 = 5.
    assert out["accuracy"] == pytest.approx(1 / 3) and out["reward"] == pytest.approx(0.5)
    assert (out["n"], out["ungraded"], out["mean_length"]) == (4.0, 1.0, 5.0)
    assert out["reward_a"] == 1.0 and out["reward_b"] == 0.25  # kind a: prompt 0 only; kind b: (0.5 + 0) / 2
    none = _summary(prompts[:1], [nan], [nan], [3], [], [])
    assert math.isnan(none["accuracy"]) and math.isnan(none["reward"]) and none["ungraded"] == 1.0


def _math_cfg() -> Config:
    cfg = Config()
    cfg.reward.functions = ["math_accuracy"]
    return cfg


def test_held_out_golds_are_checked_at_load_like_the_training_ones(capsys):
    rows = [{"prompt": "a", "answer": "70"}, {"prompt": "b", "answer": "???"}]
    check_gold_answers(_math_cfg(), rows, held_out=True)
    assert capsys.readouterr().out.startswith(
        "grpokit: warning: held-out data: 1 of 2 gold answers do not parse and will be skipped: #1 '???'"
    )
    with pytest.raises(ConfigError) as e:
        check_gold_answers(_math_cfg(), rows[1:] * 2, held_out=True)
    assert str(e.value).startswith("math_accuracy: none of the 2 held-out gold answers parses (")
    assert str(e.value).endswith("check data.answer_column and data.eval_dataset")
    check_gold_answers(_math_cfg(), [], held_out=True)  # no held-out set: nothing to check
