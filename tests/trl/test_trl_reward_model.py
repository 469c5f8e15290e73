"""A reward model given to grpokit.trl's GRPOTrainer by folder scores as TRL 1.16's _calculate_rewards:
the chat template over prompt + completion (with chat_template_kwargs), tokenized without special tokens
and without truncation; the reward is the first logit."""

import pytest

from grpokit.trl.inputs import RewardModel, reward_funcs_of
from helpers.models import char_reward_model, reward_logit

TEMPLATE = "{% if shout %}!{% endif %}{% for m in messages %}{{ m['content'] }} {% endfor %}"


def test_no_special_tokens_no_truncation_and_the_template_kwargs(tmp_path):
    model, tok = char_reward_model(tmp_path, n_positions=256, bos=True, chat_template=TEMPLATE)
    (rm,) = reward_funcs_of([str(tmp_path)], chat_template_kwargs={"shout": True})
    rm.scorer.max_length = 8  # grpokit's own cut would keep 8 tokens; TRL's path cuts nothing
    prompts = [[{"role": "user", "content": "say ab " * 10}]] * 2
    completions = [[{"role": "assistant", "content": "ab"}], [{"role": "assistant", "content": "no"}]]
    got = rm(prompts, completions)
    # the template writes "!" (shout), each message's content and a space; no "<s>" is added before it
    want = [reward_logit(model, tok, "!" + "say ab " * 10 + " " + c + " ") for c in ("ab", "no")]
    assert got == pytest.approx(want, abs=1e-5)
    with_bos = reward_logit(model, tok, "!" + "say ab " * 10 + " ab ", add_special_tokens=True)
    assert got[0] != pytest.approx(with_bos, abs=1e-5)  # the doubled-BOS reading differs


def test_text_prompts_are_prompt_plus_completion(tmp_path):
    model, tok = char_reward_model(tmp_path, bos=True)
    rm = RewardModel(str(tmp_path))
    assert rm(["hi "], ["yes"]) == pytest.approx([reward_logit(model, tok, "hi yes")], abs=1e-5)
