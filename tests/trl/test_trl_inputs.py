"""GRPOTrainer's constructor as TRL's own tests meet it: TRL's error words, TRL's refusals (Liger with a
LoRA head), ``args.accelerator_config`` for streamed data, and ``ref_model`` (grpokit/trl/inputs.py,
surface.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from datasets import Dataset

from grpokit.config import ConfigError
from grpokit.trl import GRPOConfig, GRPOTrainer


def zero(completions, **kwargs):
    return [0.0] * len(completions)


def args(out, **kw):
    base = dict(
        output_dir=str(out),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=2,
        use_cpu=True,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    return GRPOConfig(**{**base, **kw})


DATA = Dataset.from_list([{"prompt": f"say {w}"} for w in ("ab", "cd")])


def test_errors_begin_with_trls_words(chat_model, tmp_path):
    with pytest.raises(ConfigError, match="^No reward source provided: reward_funcs is empty"):
        GRPOTrainer(chat_model, args=args(tmp_path), train_dataset=DATA)
    with pytest.raises(ConfigError, match="^`train_dataset` is required unless an `environment_factory` is provided"):
        GRPOTrainer(chat_model, reward_funcs=zero, args=args(tmp_path))
    # one processing class not in a list is a list of one, as TRL: 1 entry for 2 functions is refused
    with pytest.raises(
        ConfigError,
        match="^reward_processing_classes has 1 entries but there are 2 reward functions; the two must match",
    ):
        GRPOTrainer(
            chat_model,
            reward_funcs=[zero, zero],
            args=args(tmp_path),
            train_dataset=DATA,
            reward_processing_classes=object(),
        )
    tr = GRPOTrainer(
        chat_model, reward_funcs=[zero], args=args(tmp_path), train_dataset=DATA, reward_processing_classes=None
    )
    assert tr.reward_processing_classes == [None]


class Scored:  # an environment whose get_reward is the run's reward, as TRL's environment-owned reward
    def reset(self, **kwargs):
        return None

    def get_reward(self):
        return 1.0


class Unscored:
    def reset(self, **kwargs):
        return None


def test_an_environment_with_get_reward_is_a_reward_source(chat_model, tmp_path):
    GRPOTrainer(
        chat_model, args=args(tmp_path), train_dataset=DATA, environment_factory=Scored
    )  # no reward_funcs: accepted
    with pytest.raises(ConfigError, match="^No reward source provided"):
        GRPOTrainer(chat_model, args=args(tmp_path), train_dataset=DATA, environment_factory=Unscored)


def test_a_peft_config_other_than_lora_is_refused(chat_model, tmp_path):
    """An adapter on lm_head, which TRL 1.16 refuses and grpokit trains, is tests/trl/test_trl_peft.py's."""
    from peft import PromptTuningConfig, TaskType

    with pytest.raises(ConfigError, match=r"^peft_config is a PromptTuningConfig \(a prompt-learning method\)"):
        GRPOTrainer(
            chat_model,
            reward_funcs=zero,
            args=args(tmp_path),
            train_dataset=DATA,
            peft_config=PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=8),
        )


def test_accelerator_config_as_trl_holds_it_for_streamed_data(chat_model, tmp_path, caplog):
    from transformers.trainer_pt_utils import AcceleratorConfig

    tr = GRPOTrainer(chat_model, reward_funcs=zero, args=args(tmp_path, dataloader_num_workers=4), train_dataset=DATA)
    # map-style data: transformers' default (dispatch_batches None) and the workers as given
    assert (
        isinstance(tr.args.accelerator_config, AcceleratorConfig)
        and tr.args.accelerator_config.dispatch_batches is None
    )
    assert tr.args.dataloader_num_workers == 4
    with caplog.at_level(logging.WARNING, logger="grpokit.trl"):
        tr = GRPOTrainer(
            chat_model,
            reward_funcs=zero,
            args=args(tmp_path, dataloader_num_workers=4, accelerator_config={"split_batches": True}),
            train_dataset=DATA.to_iterable_dataset(),
        )
    # a stream: dispatch_batches False, no workers (warned), the user's other key kept
    assert tr.args.accelerator_config.dispatch_batches is False and tr.args.accelerator_config.split_batches is True
    assert tr.args.dataloader_num_workers == 0 and "overriding 4" in caplog.text
    # a streamed eval set alone also sets dispatch_batches False, and keeps the train set's workers
    tr = GRPOTrainer(
        chat_model,
        reward_funcs=zero,
        args=args(tmp_path, dataloader_num_workers=4),
        train_dataset=DATA,
        eval_dataset={"x": DATA.to_iterable_dataset()},
    )
    assert tr.args.accelerator_config.dispatch_batches is False and tr.args.dataloader_num_workers == 4
    with pytest.raises(ConfigError, match=r"^Iterable datasets require `dispatch_batches=False`"):
        GRPOTrainer(
            chat_model,
            reward_funcs=zero,
            args=args(tmp_path, accelerator_config={"dispatch_batches": True}),
            train_dataset=DATA.to_iterable_dataset(),
        )


def test_ref_model_is_the_frozen_reference_or_none(chat_model, tmp_path):
    assert (
        GRPOTrainer(chat_model, reward_funcs=zero, args=args(tmp_path / "a"), train_dataset=DATA).ref_model is None
    )  # beta 0
    tr = GRPOTrainer(chat_model, reward_funcs=zero, args=args(tmp_path / "b", beta=0.1), train_dataset=DATA)
    ref = tr.ref_model
    assert ref is not None and ref is not tr.model
    # a copy of the policy: the same names and values, no gradient
    for name, p in tr.model.named_parameters():
        assert torch.equal(ref.get_parameter(name), p) and not ref.get_parameter(name).requires_grad


def test_generation_kwargs_that_change_nothing_keep_grpokits_own_loop():
    from grpokit.trl.mapping import to_config

    # do_sample True and num_beams 1 are how grpokit samples; length_penalty alone weighs beams only: top_k alone lands
    c = to_config(
        GRPOConfig(generation_kwargs={"do_sample": True, "num_beams": 1, "length_penalty": -0.1, "top_k": 50}),
        num_rows=4,
    )
    assert c.rollout.top_k == 50 and c.rollout.temperature == 1.0
    assert c.rollout.engine == "auto" and c.rollout.generation_kwargs == {}


def test_beam_search_and_other_generate_options_pick_the_generate_engine():
    from grpokit.trl.mapping import to_config

    # TRL's test_train_with_generation_kwargs: top_k is a rollout field, the rest goes to generate() as TRL passes it
    c = to_config(
        GRPOConfig(generation_kwargs={"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}),
        num_rows=4,
    )
    assert c.rollout.engine == "generate" and c.rollout.top_k == 50
    assert c.rollout.generation_kwargs == {"num_beams": 2, "length_penalty": -0.1}
    c = to_config(GRPOConfig(generation_kwargs={"do_sample": False}), num_rows=4)  # greedy, as TRL's generate() would
    assert c.rollout.engine == "generate" and c.rollout.generation_kwargs == {"do_sample": False}
    with pytest.raises(
        ConfigError, match=r"^GRPOConfig argument generation_kwargs=\{'num_return_sequences': 2\} is not supported"
    ):
        to_config(GRPOConfig(generation_kwargs={"num_return_sequences": 2}), num_rows=4)
    with pytest.raises(ConfigError, match=r"generation_kwargs=\{'num_beams': 2\}.*with use_vllm only"):
        to_config(GRPOConfig(use_vllm=True, generation_kwargs={"num_beams": 2}), num_rows=4)
    # a vLLM SamplingParams key that GenerationConfig lacks: the use_vllm sentence, not "not a setting of
    # transformers' GenerationConfig" (false under vLLM)
    with pytest.raises(ConfigError, match=r"generation_kwargs=\{'seed': 1\}.*with use_vllm only"):
        to_config(GRPOConfig(use_vllm=True, generation_kwargs={"seed": 1}), num_rows=4)


def test_trls_generation_kwargs_test_arguments_train_through_generate(chat_model, tmp_path):
    # TRL's test_train_with_generation_kwargs: 3 prompts x 3 generations, 8 tokens, beam search of 2 with
    # length_penalty -0.1 (lr 0.1 as there: the tiny model's gradients are small); one step here
    rows = Dataset.from_list([{"prompt": f"say {w}"} for w in ("ab", "cd", "ef")])
    tr = GRPOTrainer(
        chat_model,
        reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
        args=args(
            tmp_path,
            learning_rate=0.1,
            per_device_train_batch_size=3,
            num_generations=3,
            max_completion_length=8,
            report_to="none",
            generation_kwargs={"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1},
        ),
        train_dataset=rows,
    )
    assert tr.cfg.rollout.engine == "generate" and tr.cfg.rollout.generation_kwargs == {
        "num_beams": 2,
        "length_penalty": -0.1,
    }
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    assert tr.state.log_history[-1]["train_loss"] is not None
    assert all(not torch.equal(before[n], p.detach()) for n, p in tr.model.named_parameters())
