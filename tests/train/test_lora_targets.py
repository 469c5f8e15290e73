"""model.lora_target_modules read as meant: all-linear with names adds them, a name matching no module is
refused (PEFT drops it silently), no list is PEFT's default for the model type; and a resume whose
targets or rank differ from the checkpoint's is one sentence naming the field."""

import shutil

import pytest

from grpokit.config import ConfigError
from grpokit.train.lora_targets import default_targets, linear_names, peft_targets
from helpers.runs import make

# The tiny Llama's linear layers: attention q/k/v/o and the MLP's gate/up/down (lm_head is the output layer)
LINEARS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_all_linear_alone_is_peft_shorthand_and_with_names_adds_them(tiny):
    assert linear_names(tiny) == LINEARS  # the output layer is not among them
    assert peft_targets(tiny, ["all-linear"]) == "all-linear"
    assert peft_targets(tiny, ["all-linear", "lm_head"]) == sorted(LINEARS + ["lm_head"])
    assert peft_targets(tiny, ["v_proj", "q_proj"]) == ["v_proj", "q_proj"]  # names as given


@pytest.mark.parametrize(
    "targets, named",
    [(["q_proj", "qproj_typo"], "'qproj_typo'"), (["nothing"], "'nothing'"), (["all_linear"], "'all_linear'")],
)
def test_a_name_matching_no_module_is_refused_with_the_valid_ones(tiny, targets, named):
    with pytest.raises(ConfigError, match=rf"^model.lora_target_modules=.*: {named} names no module of this model"):
        peft_targets(tiny, targets)
    with pytest.raises(ConfigError, match=r"its linear layers are \['down_proj', 'gate_proj'"):
        peft_targets(tiny, targets)


def test_peft_itself_drops_an_unmatched_name_silently(tiny):
    """Why grpokit checks: PEFT adapts q_proj alone for [q_proj, qproj_typo] and says nothing."""
    import copy

    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(tiny), LoraConfig(r=2, target_modules=["q_proj", "qproj_typo"]))
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if "lora_" in n}
    assert adapted == {"q_proj"}


def test_a_run_with_all_linear_and_the_head_adapts_both(tiny_model_dir, tmp_path):
    tr = make(
        tiny_model_dir, tmp_path / "run", **{"model.lora_rank": 2, "model.lora_target_modules": "[all-linear,lm_head]"}
    )
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in tr.model.named_parameters() if p.requires_grad}
    assert adapted == set(LINEARS) | {"lm_head"}  # before: lm_head alone ("all-linear" read as a module name)


def test_no_targets_are_pefts_default_for_the_model_type():
    assert default_targets("llama") == ["q_proj", "v_proj"]  # peft/utils/constants.py
    assert default_targets("gpt2") == ["c_attn"]
    with pytest.raises(ConfigError, match=r"PEFT has no default LoRA layers for model type 'made_up'"):
        default_targets("made_up")


def _trained_run(tiny_model_dir, out, targets):
    over = {"model.lora_rank": 4, "model.lora_target_modules": targets, "train.steps": 1, "train.save_every": 1}
    make(tiny_model_dir, out, **over).train()


@pytest.mark.parametrize(
    "over, message",
    [
        (  # more layers than the checkpoint: torch's "parameter group that doesn't match" before
            {"model.lora_target_modules": "[q_proj,v_proj]"},
            r"does not match the adapters of model.lora_target_modules=\['q_proj', 'v_proj'\]: it has no adapters "
            r"on \['v_proj'\]; resume with the model.lora_target_modules the run was trained with",
        ),
        (
            {"model.lora_target_modules": "[v_proj]"},
            r"it has no adapters on \['v_proj'\]; it holds adapters on \['q_proj'\]",
        ),
        (  # refused before any weight is loaded (train/resume.py check_same_model), naming both ranks
            {"model.lora_rank": 8},
            r"model.lora_rank was 4 when the run in .* was trained and is 8 now, .*; resume with model.lora_rank=4",
        ),
    ],
)
def test_a_resume_with_other_adapters_names_the_field(tiny_model_dir, tmp_path, over, message):
    from grpokit.train.loop import Trainer
    from helpers.runs import ROWS, likes_a, tiny_cfg

    _trained_run(tiny_model_dir, tmp_path / "run", "[q_proj]")
    cfg = tiny_cfg(
        tiny_model_dir, tmp_path / "run", **{"model.lora_rank": 4, "model.lora_target_modules": "[q_proj]", **over}
    )
    cfg.data.dataset = ""
    with pytest.raises(ConfigError, match=message):
        Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True, resume=tmp_path / "run")
    shutil.rmtree(tmp_path / "run")
