"""The ``prompts`` reward functions get with an ``environment_factory`` whose ``reset()`` returns an
observation: TRL appends it to the last message of each rollout's prompt before sampling and passes that
prompt to the reward functions, row by row (a row whose reset returned None keeps its bare prompt). The same
script runs under ``trl`` and ``grpokit.trl``; before, grpokit.trl passed the dataset's prompt without the
observation (with no dataset: an empty user turn). A ``_calculate_rewards`` override's ``inputs`` keep the
dataset's row, its prompt without the observation, as TRL's; a list of text parts is appended as parts, and
a list TRL cannot append (message dicts) is refused in one sentence where TRL raises a KeyError."""

from __future__ import annotations

import importlib
import threading

import pytest
from datasets import Dataset

SEEN: list = []  # the prompts each reward call got
KEYS: list = []  # the keywords beside prompts and completions of each reward call
INPUTS: list = []  # the inputs rows a _calculate_rewards override got


class Game:
    """An environment whose reset() shows the board: " OBS" (``Game.boards`` says what each reset returns)."""

    boards: list = [" OBS"]
    resets = 0
    lock = threading.Lock()

    def reset(self, **kwargs):
        with Game.lock:  # grpokit resets a batch's environments side by side
            k, Game.resets = Game.resets, Game.resets + 1
        return Game.boards[k % len(Game.boards)]

    def move(self, d: str) -> str:
        """Move.

        Args:
            d: the direction.
        """
        return "ok"


def recorded(prompts, completions, **kwargs):
    SEEN.extend(prompts)
    KEYS.append(sorted(kwargs))
    return [0.0] * len(completions)


def overriding(base):
    """``base`` (either library's GRPOTrainer) with a ``_calculate_rewards`` that records its ``inputs`` and
    adds a key to every row before ``super()``: TRL's reward functions get every key of the rows."""

    class Recorded(base):
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            INPUTS.extend(dict(x) for x in inputs)
            for x in inputs:
                x["bonus"] = 1
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    return Recorded


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    """A tiny Qwen2 whose character tokenizer has TRL's Qwen3 template (tools, <tool_call>)."""
    pytest.importorskip("trl")
    from trl.chat_template_utils import qwen3_chat_template

    from helpers.trl_models import make_qwen2_tool_model

    return make_qwen2_tool_model(tmp_path_factory.mktemp("qwen-tools"), qwen3_chat_template, max_positions=2048)[0]


def run(lib: str, model, tmp_path, boards: list, override: bool = False, **data) -> tuple[list, dict]:
    """One step of 2 prompts x 2 rollouts; the prompts the reward function got and the step's logged line
    (``override``: through a subclass's ``_calculate_rewards``, ``overriding``)."""
    trl = importlib.import_module(lib)
    SEEN.clear(), KEYS.clear(), INPUTS.clear()
    Game.boards, Game.resets = boards, 0
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / lib), per_device_train_batch_size=4, num_generations=2, max_completion_length=6,
        max_steps=1, use_cpu=True, report_to="none", save_strategy="no", seed=0, max_tool_calling_iterations=1,
    )  # fmt: skip
    cls = overriding(trl.GRPOTrainer) if override else trl.GRPOTrainer
    trainer = cls(str(model), reward_funcs=[recorded], args=args, environment_factory=Game, **data)
    trainer.train()
    return list(SEEN), trainer.state.log_history[0]


PLAY = Dataset.from_list([{"prompt": [{"role": "user", "content": "play"}], "level": 1}] * 2)


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_reward_functions_get_the_prompt_with_the_reset_observation(lib, qwen_model, tmp_path):
    seen, _ = run(lib, qwen_model, tmp_path, [" OBS"], train_dataset=PLAY)
    assert seen == [[{"role": "user", "content": "play OBS"}]] * 4  # before (grpokit.trl): "play"


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_an_environment_that_owns_the_data_gives_its_observation_as_the_user_turn(lib, qwen_model, tmp_path):
    seen, _ = run(lib, qwen_model, tmp_path, ["OBS"])  # no train_dataset: TRL's empty user turns, filled by reset()
    assert seen == [[{"role": "user", "content": "OBS"}]] * 4  # before (grpokit.trl): an empty user turn


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_each_rollout_gets_its_own_observation_and_none_leaves_the_prompt_bare(lib, qwen_model, tmp_path):
    seen, line = run(lib, qwen_model, tmp_path, [" A", None, " B", " C"], train_dataset=PLAY)
    # grpokit resets side by side, so which rollout drew which board is not fixed: compare them sorted
    assert sorted(m[-1]["content"] for m in seen) == ["play", "play A", "play B", "play C"]
    # each rollout's observation is in its prompt, so the model samples its whole max_completion_length=6 (the
    # random model never ends early). Before, grpokit.trl began each completion with the part of the prompt its
    # group did not share, as environment tokens that used up the 6: the model sampled none (mean_length 0).
    assert line["completions/mean_length"] == 6.0


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_a_calculate_rewards_override_gets_the_dataset_rows_as_inputs(lib, qwen_model, tmp_path):
    seen, _ = run(lib, qwen_model, tmp_path, [" OBS"], override=True, train_dataset=PLAY)
    assert seen == [[{"role": "user", "content": "play OBS"}]] * 4  # prompts: with the observation
    # inputs: the dataset's rows. Before (grpokit.trl): "play OBS" as the prompt, and an "environments" key
    assert INPUTS == [{"prompt": [{"role": "user", "content": "play"}], "level": 1}] * 4
    # the key the override added reached the reward function (before, grpokit.trl's super() read its own copy)
    assert KEYS == [["bonus", "completion_ids", "environments", "level", "log_extra", "log_metric", "trainer_state"]]


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_text_parts_from_reset_are_appended_to_the_last_message_as_parts(lib, qwen_model, tmp_path):
    seen, _ = run(lib, qwen_model, tmp_path, [[{"type": "text", "text": " OBS"}]], train_dataset=PLAY)
    # the string content becomes one text part, the observation's parts follow; before (grpokit.trl) the
    # list's str() was appended: "play[{'type': 'text', 'text': ' OBS'}]"
    parts = [{"type": "text", "text": "play"}, {"type": "text", "text": " OBS"}]
    assert seen == [[{"role": "user", "content": parts}]] * 4


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_a_list_of_messages_from_reset_fails_under_trl_and_is_refused_in_one_sentence(lib, qwen_model, tmp_path):
    from grpokit.config.sections import ConfigError

    boards = [[{"role": "user", "content": "OBS"}]]
    # TRL's _tokenize_prompts reads part["type"] of each content part: KeyError 'type'. Before, grpokit.trl
    # trained on "play[{'role': 'user', 'content': 'OBS'}]"
    with pytest.raises(KeyError if lib == "trl" else ConfigError, match="type"):
        run(lib, qwen_model, tmp_path, boards, train_dataset=PLAY)
