"""EDGE-GRPO guided error correction (arXiv 2507.21848): all-wrong groups get a corrected, re-scored member."""

import pytest
import torch

from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec
from grpokit.rollout import gec
from grpokit.types import Prompt, Rollout, ScoredBatch
from grpokit.validation import validate
from helpers.models import char_tokenizer


def contains_answer(prompts, completions, answer, **kwargs):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def render(answer):  # names only `answer`: the prompt and other columns are not passed to it
    return f"={answer}"


def _batch(tok):
    # prompt 0 "1+2" (gold 3): both completions wrong -> all wrong; prompt 1 "2+2" (gold 4): one right
    prompts = [
        Prompt("1+2", tok("1+2")["input_ids"], {"answer": "3"}),
        Prompt("2+2", tok("2+2")["input_ids"], {"answer": "4"}),
    ]
    texts = ["=5", "=7", "=4", "=9"]
    ids = [tok(t)["input_ids"] + [1] for t in texts]  # eos = 1
    ro = Rollout([p.ids for p in prompts], ids, [[-0.5] * len(i) for i in ids], ["eos"] * 4, 2)
    total = torch.tensor([0.0, 0.0, 1.0, 0.0])
    return ScoredBatch(prompts, ro, texts, total[:, None].clone(), total, ["contains_answer"], {})


@pytest.mark.parametrize("mode", ["gold", "reflection"])
def test_all_wrong_group_gets_a_corrected_rescored_member(mode):
    tok = char_tokenizer()
    runner = RewardRunner([RewardSpec(fn=contains_answer, name="contains_answer", weight=1.0)], num_workers=0)
    sb = gec.correct(_batch(tok), tok, runner, mode=mode, render=render, reflection="ab ab", max_reward=0.0, eos_id=1)
    # only group 0 (rows 0, 1) was all wrong: its last row (1) is replaced, the other rows are untouched
    want = "=3" if mode == "gold" else "=7 ab ab =3"  # reflection: the wrong attempt, the cue, the gold answer
    assert sb.texts == ["=5", want, "=4", "=9"]
    assert sb.rollout.completion_ids[1] == tok(want)["input_ids"] + [1]  # ends with EOS, finish reason eos
    assert sb.rollout.finish_reasons[1] == "eos" and sb.rollout.sampling_logprobs[1] == [0.0] * len(
        tok(want)["input_ids"] + [1]
    )
    assert sb.rollout.completion_ids[3] == tok("=9")["input_ids"] + [1]
    # re-scored by the same reward functions: the corrected member is right, so the group is no longer flat
    assert sb.total_N.tolist() == [0.0, 1.0, 1.0, 0.0] and sb.rewards_NF[:, 0].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert sb.metrics["gec/corrected_groups"] == 1.0 and sb.metrics["gec/injected_reward_mean"] == 1.0


def test_the_failure_mask_follows_the_corrected_rows():
    """Rows 1 (in the all-wrong group) and 3 had failed; row 1 is replaced by a correction the runner scored
    without failure, row 3 keeps its mark. Before, the corrected batch dropped the mask altogether, so the
    step's rewards/<f>/mean counted failure_value as a score."""
    tok = char_tokenizer()
    runner = RewardRunner([RewardSpec(fn=contains_answer, name="contains_answer", weight=1.0)], num_workers=0)
    sb0 = _batch(tok)
    sb0.failed_NF = torch.tensor([[False], [True], [False], [True]])
    sb = gec.correct(sb0, tok, runner, mode="gold", render=render, reflection="", max_reward=0.0, eos_id=1)
    assert sb.failed_NF[:, 0].tolist() == [False, False, False, True]


def test_the_corrected_rows_are_no_samplers_and_the_others_keep_their_versions():
    """An asynchronous batch's rows carry the version that drew them (rollout/staleness.py): a corrected row was
    drawn by no policy (age 0, None), the others keep theirs. Before, the corrected batch dropped every row's."""
    tok = char_tokenizer()
    runner = RewardRunner([RewardSpec(fn=contains_answer, name="contains_answer", weight=1.0)], num_workers=0)
    sb0 = _batch(tok)
    sb0.rollout.sampling_versions = [[2] * len(c) for c in sb0.rollout.completion_ids]
    sb = gec.correct(sb0, tok, runner, mode="gold", render=render, reflection="", max_reward=0.0, eos_id=1)
    assert sb.rollout.sampling_versions == [[2, 2, 2], None, [2, 2, 2], [2, 2, 2]]  # "=5" + eos: 3 tokens a row


def test_no_all_wrong_group_changes_nothing():
    tok = char_tokenizer()
    sb0 = _batch(tok)
    sb0.total_N[0] = 1.0
    sb = gec.correct(sb0, tok, None, mode="gold", render=render, reflection="", max_reward=0.0, eos_id=1)
    assert sb.texts == ["=5", "=7", "=4", "=9"] and sb.metrics["gec/corrected_groups"] == 0.0


def test_renderer_and_config_errors():
    assert gec.resolve_renderer("grpokit.data.tasks.arithmetic:format_completion")("125") == "<answer>125</answer>"
    with pytest.raises(ConfigError, match="cannot be imported"):
        gec.resolve_renderer("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="needs algo.error_correction_fn=module:function"):
        validate(apply_overrides(Config(), ["algo.error_correction=gold"]))
    with pytest.raises(ConfigError, match="dynamic_sampling drops"):
        validate(
            apply_overrides(
                Config(),
                [
                    "algo.error_correction=gold",
                    "algo.dynamic_sampling=true",
                    "algo.error_correction_fn=grpokit.data.tasks.arithmetic:format_completion",
                ],
            )
        )
