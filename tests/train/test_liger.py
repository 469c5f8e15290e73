"""model.kernels (train/liger.py): when liger-kernel's kernels are applied, refused or skipped, and how
they are asked for. liger-kernel runs Triton GPU kernels only; tests/project/test_gpu.py runs the real
package on a GPU, these run its entry point as a stand-in module (the same dictionary of per-family
functions liger-kernel exports)."""

import sys
import types

import pytest
import torch

from grpokit.config import Config, ConfigError, apply_overrides
from grpokit.train import liger
from grpokit.validation import validate
from helpers.models import tiny_llama

CUDA = torch.device("cuda")  # a device object only: nothing here runs on it


@pytest.fixture
def fake_liger(monkeypatch):
    """A liger_kernel whose llama function records its calls; its signature lacks ``rope`` on purpose."""
    calls = []

    def apply_llama(model=None, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True):
        calls.append(
            dict(model=model, rms_norm=rms_norm, swiglu=swiglu, ce=cross_entropy, flce=fused_linear_cross_entropy)
        )

    patch = types.ModuleType("liger_kernel.transformers.monkey_patch")
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": apply_llama, "qwen2": apply_llama}
    for name, mod in (
        ("liger_kernel", types.ModuleType("liger_kernel")),
        ("liger_kernel.transformers", types.ModuleType("liger_kernel.transformers")),
        ("liger_kernel.transformers.monkey_patch", patch),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def test_the_setting_is_validated():
    with pytest.raises(ConfigError, match=r"model.kernels.*'fast'.*torch.*liger.*auto"):
        validate(apply_overrides(Config(), ["model.kernels=fast"]))
    assert validate(apply_overrides(Config(), ["model.kernels=auto"])).model.kernels == "auto"


def test_torch_applies_nothing_and_auto_keeps_the_model_where_liger_cannot_run(fake_liger):
    model = tiny_llama()
    assert liger.apply_kernels("torch", model, CUDA) is False
    assert liger.apply_kernels("auto", model, torch.device("cpu")) is False
    assert fake_liger == []


def test_liger_is_refused_with_the_reason_and_the_alternatives(fake_liger):
    with pytest.raises(ConfigError, match=r"model.kernels='liger' needs a CUDA device .* this run's device is cpu"):
        liger.apply_kernels("liger", tiny_llama(), torch.device("cpu"))
    other = tiny_llama()
    other.config.model_type = "gpt_neox"
    with pytest.raises(ConfigError, match=r"no kernels for model type 'gpt_neox' \(it patches: llama, qwen2\)"):
        liger.apply_kernels("liger", other, CUDA)
    assert liger.apply_kernels("auto", other, CUDA) is False and fake_liger == []


def test_without_the_package_liger_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # an import of it raises ImportError
    with pytest.raises(ConfigError, match=r"needs the liger-kernel package \(pip install liger-kernel\)"):
        liger.apply_kernels("liger", tiny_llama(), CUDA)
    assert liger.apply_kernels("auto", tiny_llama(), CUDA) is False


def test_the_family_function_gets_the_model_and_only_the_kernels_it_takes(fake_liger):
    model = tiny_llama()
    assert liger.apply_kernels("auto", model, CUDA) is True
    # norm and SwiGLU on, liger's own losses off (grpokit's head computes the log-probs); no rope
    # argument, as this function has none
    assert fake_liger == [dict(model=model, rms_norm=True, swiglu=True, ce=False, flce=False)]


def test_a_lora_policy_is_patched_in_its_base_model(fake_liger):
    from peft import LoraConfig, get_peft_model

    base = tiny_llama()
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    assert liger.apply_kernels("liger", model, CUDA) is True
    assert fake_liger[0]["model"] is base


def test_a_cpu_run_asking_for_liger_stops_before_training(tmp_path):
    from grpokit.train.loop import Trainer

    cfg = apply_overrides(
        Config(),
        ["train.steps=1", "data.eval_size=0", "record.sinks=[jsonl]", "model.kernels=liger", f"train.out={tmp_path}/r"],
    )
    with pytest.raises(ConfigError, match="model.kernels='liger' needs a CUDA device"):
        Trainer(cfg, quiet=True)


def test_auto_is_the_default_and_keeps_the_models_code_when_a_liger_patch_fails(monkeypatch, capsys):
    assert Config().model.kernels == "auto"

    def broken(model=None, rms_norm=True):
        raise AttributeError("no attribute 'rotary_emb'")

    patch = types.ModuleType("liger_kernel.transformers.monkey_patch")
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": broken}
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", patch)
    assert liger.apply_kernels("auto", tiny_llama(), CUDA) is False
    assert (
        "liger-kernel could not patch this model (AttributeError(\"no attribute 'rotary_emb'\")); its own code runs"
        in (capsys.readouterr().out)
    )
    with pytest.raises(AttributeError, match="rotary_emb"):  # asked for by name: the failure is the user's to see
        liger.apply_kernels("liger", tiny_llama(), CUDA)
