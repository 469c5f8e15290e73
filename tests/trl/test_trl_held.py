"""What TRL reads afresh at every batch and scripts change in place (grpokit/trl/contract/held*.py):
``reward_weights``, ``reward_funcs`` and ``generation_config`` followed from the next batch, as TRL (checked
against trl when it is installed); what grpokit cannot follow is read-only, every write one sentence."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from datasets import Dataset
from transformers import GenerationConfig, TrainerCallback

from grpokit.config import ConfigError
from grpokit.rewards.runner import RewardRunner
from grpokit.trl import GRPOConfig, GRPOTrainer
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef")])


def one(completions, **kwargs):
    return [1.0] * len(completions)


def two(completions, **kwargs):
    return [2.0] * len(completions)


def seven(completions, **kwargs):
    return [7.0] * len(completions)


def libraries():
    """grpokit.trl's classes, and trl's when it is installed (the oracle of TRL's behaviour)."""
    out = [("grpokit", GRPOConfig, GRPOTrainer)]
    try:
        import trl

        out.append(("trl", trl.GRPOConfig, trl.GRPOTrainer))
    except ImportError:
        pass
    return out


class AtStep(TrainerCallback):
    """Calls ``change(trainer)`` once, at the end of TRL step 1 (so step 2's batch is the first to see it)."""

    def __init__(self, change):
        self.change, self.trainer = change, None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.change(self.trainer)


def in_place_weight(tr):
    tr.reward_weights[0] = 3.0


def new_weights(tr):
    tr.reward_weights = torch.tensor([3.0, 0.5])


def swapped_function(tr):
    tr.reward_funcs[0] = seven


# rewards one (1.0) and two (2.0) on every completion, weights [1, 1] unless changed:
#   step 1: 1*1 + 1*2 = 3;  weights[0] = 3 in place from step 2: 3*1 + 1*2 = 5;
#   a new tensor [3, 0.5] from step 2: 3*1 + 0.5*2 = 4;  reward_funcs[0] = seven from step 2: 1*7 + 1*2 = 9
# (TRL's metric names stay: rewards/one/mean is the swapped function's 7)
CHANGES = {
    "weight_in_place": (in_place_weight, [3.0, 5.0], [1.0, 1.0]),
    "new_weights": (new_weights, [3.0, 4.0], [1.0, 1.0]),
    "function_swapped": (swapped_function, [3.0, 9.0], [1.0, 7.0]),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_during_training_is_the_next_batchs_as_trl(chat_model, tmp_path, change):
    do, rewards, ones = CHANGES[change]
    for name, Config, Trainer in libraries():
        cb = AtStep(do)
        args = small_args(Config, tmp_path / name, max_steps=2, logging_steps=1, report_to="none", save_strategy="no")
        tr = Trainer(chat_model, reward_funcs=[one, two], train_dataset=DATA, args=args, callbacks=[cb])
        cb.trainer = tr
        tr.train()
        entries = [e for e in tr.state.log_history if "reward" in e]
        assert [e["reward"] for e in entries] == pytest.approx(rewards), name
        assert [e["rewards/one/mean"] for e in entries] == pytest.approx(ones), name


def test_weights_changed_in_a_subclass_init_weight_every_batch(chat_model, tmp_path):
    class Curriculum(GRPOTrainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.reward_weights[0] = 3.0  # in place, as TRL subclasses do

    args = small_args(GRPOConfig, tmp_path, max_steps=1, logging_steps=1, report_to="none", save_strategy="no")
    tr = Curriculum(chat_model, reward_funcs=[one, two], train_dataset=DATA, args=args)
    assert tr.reward_weights.tolist() == [3.0, 1.0] and tr.reward_weights is tr.reward_weights  # one tensor
    tr.train()
    assert tr.state.log_history[0]["reward"] == pytest.approx(5.0)  # 3*1 + 1*2


def test_a_run_without_changes_keeps_its_reward_functions(chat_model, tmp_path, monkeypatch):
    """The held list holds the very functions the runner was built with: nothing is swapped per batch."""

    def never(self, f, fn):
        raise AssertionError("set_function called without a change")

    monkeypatch.setattr(RewardRunner, "set_function", never)
    args = small_args(GRPOConfig, tmp_path, max_steps=1, report_to="none", save_strategy="no")
    GRPOTrainer(chat_model, reward_funcs=[one, two], train_dataset=DATA, args=args).train()


def test_what_the_reward_stage_cannot_take_is_refused_in_one_sentence(chat_model, tmp_path):
    args = small_args(GRPOConfig, tmp_path, max_steps=1, report_to="none")
    tr = GRPOTrainer(chat_model, reward_funcs=[one, two], train_dataset=DATA, args=args)
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.reward_funcs can be replaced by as many functions \(2"):
        tr.reward_funcs.append(seven)
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.reward_weights must hold one finite number per reward"):
        tr.reward_weights = [1.0]
    tr.reward_weights[1] = float("nan")  # in place: refused when the next batch reads it
    completions = [[{"role": "assistant", "content": "ab"}]] * 4
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.reward_weights .* it holds \[1.0, nan\]"):
        tr._calculate_rewards([{"prompt": "p"}] * 4, ["p"] * 4, completions, [[3, 4]] * 4)
    assert tr.reward_funcs == [one, two] and tr.reward_func_names == ["one", "two"]


def test_what_grpokit_cannot_follow_is_read_only_in_one_sentence(chat_model, tmp_path):
    args = small_args(GRPOConfig, tmp_path, report_to="none")
    tr = GRPOTrainer(chat_model, reward_funcs=[one], train_dataset=DATA, args=args, tools=[two])
    writes = {
        "reward_func_names": lambda: tr.reward_func_names.append("x"),
        "reward_processing_classes": lambda: tr.reward_processing_classes.__setitem__(0, None),
        "tools": lambda: tr.tools.extend([seven]),
        "eos_token_ids": lambda: tr.eos_token_ids.append(3),
        "generation_kwargs": lambda: tr.generation_kwargs.update(top_k=3),
    }
    for name, write in writes.items():
        with pytest.raises(ConfigError, match=rf"^GRPOTrainer.{name} cannot be changed: "):
            write()
        with pytest.raises(ConfigError, match=rf"^GRPOTrainer.{name} cannot be changed: "):
            setattr(tr, name, getattr(tr, name))
    names = copy.deepcopy(tr.reward_func_names)  # a copy is plain, the caller's own
    names.append("x")
    assert type(names) is list and tr.reward_func_names == ["one"] and list(tr.tools) == [two]


def test_generation_configs_sampled_fields_are_the_next_batchs_as_trl(chat_model, tmp_path):
    """A subclass's ``self.generation_config.max_new_tokens = 2`` under max_completion_length=4: every
    completion of the run is at most 2 tokens (TRL: generate() reads generation_config at every batch)."""
    for name, Config, Trainer in libraries():
        lengths = []

        def measured(completion_ids, **kwargs):
            lengths.extend(len(c) for c in completion_ids)
            return [0.0] * len(completion_ids)

        class Shorter(Trainer):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                self.generation_config.max_new_tokens = 2

        args = small_args(Config, tmp_path / name, max_steps=1, report_to="none", save_strategy="no")
        Shorter(chat_model, reward_funcs=[measured], train_dataset=DATA, args=args).train()
        assert lengths and max(lengths) == 2, name  # the tiny random model rarely ends a completion early


def test_generation_configs_other_fields_and_invalid_values_are_refused(chat_model, tmp_path):
    args = small_args(GRPOConfig, tmp_path, report_to="none")
    tr = GRPOTrainer(chat_model, reward_funcs=[one], train_dataset=DATA, args=args)
    gc = tr.generation_config
    assert gc is tr.generation_config and gc.max_new_tokens == 4 and gc.do_sample  # one object, TRL's values
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.generation_config.do_sample is fixed when the run is built"):
        gc.do_sample = False
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.generation_config.temperature=0 is not valid"):
        gc.temperature = 0
    with pytest.raises(ConfigError, match=r"max_new_tokens=5 is not valid; give a whole number from 1 to .* \(4\)"):
        gc.max_new_tokens = 5
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.generation_config.do_sample is fixed"):
        tr.generation_config = GenerationConfig(max_new_tokens=2, do_sample=False)  # nothing half-applied
    assert gc.max_new_tokens == 4 and gc.do_sample and tr._sampling_written == {}
    mine = copy.deepcopy(gc)  # what generate() does: a plain copy, the caller's own
    mine.max_new_tokens, mine.do_sample = 3, False
    assert type(mine) is GenerationConfig and tr._sampling_written == {}
    gc.temperature, gc.top_k = 0.5, None  # honoured: the run's sampler settings (top_k None: off)
    params = tr._get().params
    assert (params.temperature, params.top_k, params.max_new_tokens) == (0.5, 0, 4)


def test_eos_token_ids_are_trls_the_tokenizers_and_the_models(chat_model, tmp_path):
    """A model whose generation_config.json lists a second end id (Qwen's end of turn): TRL's eos_token_ids
    is [tokenizer eos 1, 45] (the tokenizer's first when the model's list lacks it; here it has it)."""
    folder = tmp_path / "model"
    shutil.copytree(chat_model, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [1, 45]}))
    for name, Config, Trainer in libraries():
        args = small_args(Config, tmp_path / name, report_to="none")
        tr = Trainer(str(folder), reward_funcs=[one], train_dataset=DATA, args=args)
        assert tr.eos_token_ids == [1, 45], name
