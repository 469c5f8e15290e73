"""PEFT inputs as TRL 1.16 takes them, with ``trl`` itself as the oracle where a run is cheap: a PeftModel
whose adapter is already trained is its own KL reference; a LoraConfig without target_modules adapts
PEFT's default layers for the model type; where grpokit differs it is stricter (a target name that
matches nothing is refused, PEFT drops it) or does more (an adapter on lm_head trains, TRL refuses it)."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

from grpokit.config import ConfigError
from helpers.models import perturb_lora_b
from helpers.trl_models import small_args

BACKENDS = ["grpokit.trl", pytest.param("trl", marks=pytest.mark.slow)]
DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")])


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


def varied(completions, **kwargs):
    return [float(i) for i in range(len(completions))]  # unequal within each group: a nonzero advantage


def adapted(model) -> set[str]:
    """The layers (last name part) that carry a trainable adapter."""
    return {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_trained_adapter_is_the_kl_reference(backend, chat_model, tmp_path):
    # Before the first update the policy is the adapter as given, and so is the reference (TRL: a frozen
    # copy named "ref"), so every token's log-ratio is 0 and the k3 KL exp(0) - 0 - 1 = 0. Against the base
    # with the adapters off (grpokit before) it was 0.020 on this adapter.
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    mod = pytest.importorskip(backend)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(chat_model)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    perturb_lora_b(model, seed=1, scale=2.0)
    args = small_args(mod.GRPOConfig, tmp_path / "run", max_steps=1, logging_steps=1, report_to="none", beta=0.1)
    trainer = mod.GRPOTrainer(model, reward_funcs=[short], train_dataset=DATA, args=args)
    trainer.train()
    assert trainer.state.log_history[0]["kl"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lora_config_without_targets_adapts_pefts_default_layers(backend, chat_model, tmp_path):
    from peft import LoraConfig

    mod = pytest.importorskip(backend)
    config = LoraConfig(r=4, lora_dropout=0.0)  # target_modules None, as TRL's get_peft_config(ModelConfig())
    args = small_args(mod.GRPOConfig, tmp_path / "run", max_steps=1, report_to="none", save_strategy="no")
    trainer = mod.GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args, peft_config=config)
    trainer.train()
    assert adapted(trainer.model) == {"q_proj", "v_proj"}  # llama's entry in PEFT's table, not every linear layer
    trainer.save_model(str(tmp_path / "final"))
    assert sorted(json.loads((tmp_path / "final" / "adapter_config.json").read_text())["target_modules"]) == [
        "q_proj",
        "v_proj",
    ]


def test_no_targets_on_a_model_type_peft_has_no_default_for_is_refused():
    from grpokit.trl.inputs import lora_targets

    model = type("Custom", (), {"config": type("Config", (), {"model_type": "made_up"})()})()
    with pytest.raises(ConfigError, match=r"^peft_config.target_modules is None and PEFT has no default LoRA layers"):
        lora_targets(None, model, False)


def test_a_target_matching_nothing_is_refused_where_peft_drops_it(chat_model, tmp_path):
    from peft import LoraConfig

    from grpokit.trl import GRPOConfig, GRPOTrainer

    args = small_args(GRPOConfig, tmp_path / "run", max_steps=1, report_to="none")
    config = LoraConfig(r=4, target_modules=["q_proj", "qproj_typo"])
    trainer = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args, peft_config=config)
    with pytest.raises(
        ConfigError, match=r"^peft_config.target_modules=\['q_proj', 'qproj_typo'\]: 'qproj_typo' names"
    ):
        trainer.train()  # the model is loaded, and its layers known, at the first use


def test_an_adapter_on_lm_head_trains_where_trl_refuses_it(chat_model, tmp_path):
    from peft import LoraConfig

    from grpokit.trl import GRPOConfig, GRPOTrainer

    head = LoraConfig(r=4, target_modules=["q_proj", "lm_head"])
    args = small_args(GRPOConfig, tmp_path / "run", max_steps=1, report_to="none", learning_rate=0.1)
    trainer = GRPOTrainer(chat_model, reward_funcs=[varied], train_dataset=DATA, args=args, peft_config=head)
    trainer.train()
    B = trainer.model.base_model.model.lm_head.lora_B["default"].weight
    assert B.abs().sum() > 0  # PEFT starts B at 0: the head's adapter got a gradient and moved
    # grpokit's own loss reads the head through its adapter with Liger's kernels too (TRL's fused loss would not)
    args = small_args(GRPOConfig, tmp_path / "liger", max_steps=1, report_to="none", use_liger_kernel=True)
    trainer = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args, peft_config=head)
    assert trainer.cfg.model.lora_target_modules == ["lm_head", "q_proj"]
    trl = pytest.importorskip("trl")
    args = small_args(trl.GRPOConfig, tmp_path / "trl", max_steps=1, report_to="none")
    with pytest.raises(ValueError, match="Applying a PEFT adapter to `lm_head` is not supported"):
        trl.GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args, peft_config=head)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("disable", [True, False])
def test_disable_dropout_zeroes_the_adapters_dropout_as_trl(backend, disable, chat_model, tmp_path):
    # TRL's disable_dropout sets every torch Dropout of the model to 0, the LoRA adapters' included (grpokit.trl:
    # model.disable_dropout, and model.lora_dropout 0); False, TRL's default, trains with the adapters' 0.1
    from peft import LoraConfig

    mod = pytest.importorskip(backend)
    config = LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj"])
    args = small_args(mod.GRPOConfig, tmp_path / "run", max_steps=1, report_to="none", save_strategy="no")
    args.disable_dropout = disable
    trainer = mod.GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args, peft_config=config)
    trainer.train()
    dropouts = {m.p for m in trainer.model.modules() if isinstance(m, torch.nn.Dropout)}
    # off: TRL's adapters keep Dropout modules at 0, grpokit.trl's are built without one (PEFT's lora_dropout 0)
    assert dropouts <= {0.0} if disable else dropouts == {0.1}
    if backend == "grpokit.trl":
        assert (trainer.cfg.model.disable_dropout, trainer.cfg.model.lora_dropout) == (disable, 0.0 if disable else 0.1)
