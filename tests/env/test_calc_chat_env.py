"""The pieces of bench/hub_env_trl.py (grpokit and TRL's environment_factory on one verifiers
environment) that check in seconds: the chat model's template renders a tool call that TRL's own
parser and grpokit's both read back, passes TRL's checks for tool-calling templates, and masks
the warm-up's loss to the model's tokens; the environment class and rubric score a TRL-shaped
conversation."""

import sys

import pytest

from helpers.paths import ROOT

pytest.importorskip("verifiers.v1")
trl_templates = pytest.importorskip("trl.chat_template_utils")

sys.path.insert(0, str(ROOT / "bench"))
import calc_chat_model as ccm  # noqa: E402
from grpokit.env.parse import parse_tool_calls  # noqa: E402
from hub_env_trl import environment  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return ccm.build_tokenizer()


def test_template_passes_trls_checks(tok):
    assert trl_templates.supports_tool_calling(tok)
    assert trl_templates.is_chat_template_prefix_preserving(tok)


def test_a_call_turn_parses_the_same_under_trl_and_grpokit(tok):
    messages = [{"role": "user", "content": "57*68="}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert prompt == tok("<|user|>57*68=<eos><|assistant|>", add_special_tokens=False)["input_ids"]
    assert len(prompt) == 9  # 3 markers (<|user|>, <eos>, <|assistant|>) and 6 characters
    turn = "<tool_call>" + ccm.CALL_HEAD + "57*68" + ccm.CALL_TAIL + "</tool_call><eos>"
    ids = tok(turn, add_special_tokens=False)["input_ids"]
    assert len(ids) == 10  # <tool_call>, the JSON head, 5 characters, the JSON tail, </tool_call>, <eos>
    parsed = trl_templates.parse_response(tok, ids, prefix=prompt)
    assert parsed["tool_calls"] == [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "57*68"}}}
    ]
    (call,) = parse_tool_calls(tok.decode(ids, skip_special_tokens=True), ["calculator"])
    assert (call.name, call.arguments) == ("calculator", {"expression": "57*68"})
    answer = tok("<answer>3876</answer><eos>", add_special_tokens=False)["input_ids"]
    assert trl_templates.parse_response(tok, answer, prefix=prompt) == {
        "role": "assistant",
        "content": "<answer>3876</answer>",
    }


def test_warm_up_loss_is_on_the_models_turns_only(tok):
    ids, labels = ccm.episode_ids(tok, ccm.conversation(57, 68, use_tool=True))
    text = tok.decode(ids)
    assert text == tok.apply_chat_template(ccm.conversation(57, 68, use_tool=True), tokenize=False)
    # prompt 9, call turn 10 (model), tool reply <|tool|>3876<eos><|assistant|> 7, answer 7 (model): 33
    assert len(ids) == 33
    assert [i for i, lab in enumerate(labels) if lab != -100] == list(range(9, 19)) + list(range(26, 33))
    ids, labels = ccm.episode_ids(tok, ccm.conversation(57, 68, use_tool=False))
    assert tok.decode([i for i, lab in zip(ids, labels) if lab != -100]) == "<answer>4200</answer><eos>"


def test_environment_and_rubric_score_a_trl_conversation():
    train, held_out, rewards, env_cls = environment(steps=1, seed=0, n_held_out=2)
    assert len(train) == 16 and len(held_out) == 2
    row = train[0]
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith("=")
    a, b = map(int, row["prompt"][0]["content"][:-1].split("*"))
    env = env_cls()
    assert env.reset(**row) is None
    result = env.calculator(expression=f"{a}*{b}")
    assert result == str(a * b)
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}}
    conversation = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": result},
    ]
    right = conversation + [{"role": "assistant", "content": f"<answer>{a * b}</answer>"}]
    wrong = conversation + [{"role": "assistant", "content": f"<answer>{a * b + 1}</answer>"}]
    (correct,) = rewards
    assert correct([row["prompt"]] * 2, [right, wrong], vf_task=[row["vf_task"]] * 2) == [1.0, 0.0]
