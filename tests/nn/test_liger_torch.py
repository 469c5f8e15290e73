"""nn/liger_torch.py: a policy made of liger-kernel's own classes (transformers' classes patched by model.kernels on a
card earlier in the process) computes with torch's ops off CUDA, with the model's own values; any other liger class is
refused in one sentence. liger-kernel needs a card, so its classes are stood in for by classes of the same names and
module whose forward fails as liger's Triton kernels do on CPU tensors."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers.models.llama import modeling_llama

from grpokit.config.sections import ConfigError
from grpokit.nn import liger_torch
from helpers.models import tiny_causal_lm
from helpers.runs import make

TRITON_ON_CPU = "Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)"


class LigerRMSNorm(torch.nn.Module):
    """liger's RMSNorm as it stands in a model: the attributes its __init__ sets, a GPU-only forward."""

    def __init__(self, hidden_size, eps=1e-6, offset=0.0, casting_mode="llama"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon, self.offset, self.casting_mode = eps, offset, casting_mode

    def forward(self, x):
        raise ValueError(TRITON_ON_CPU)


class LigerSwiGLUMLP(torch.nn.Module):
    def __init__(self, config, intermediate_size=None):
        super().__init__()
        n, m = config.hidden_size, intermediate_size or config.intermediate_size
        self.gate_proj, self.up_proj = torch.nn.Linear(n, m, bias=False), torch.nn.Linear(n, m, bias=False)
        self.down_proj = torch.nn.Linear(m, n, bias=False)

    def forward(self, x):
        raise ValueError(TRITON_ON_CPU)


class LigerLayerNorm(torch.nn.Module):
    def forward(self, x):
        raise ValueError(TRITON_ON_CPU)


for _cls in (LigerRMSNorm, LigerSwiGLUMLP, LigerLayerNorm):
    _cls.__module__ = "liger_kernel.transformers.fake"


def _as_liger(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its norms and MLPs turned into the stand-ins (parameters kept), as a later-built model is."""
    for m in model.modules():
        if isinstance(m, modeling_llama.LlamaRMSNorm):
            m.__class__, m.offset, m.casting_mode = LigerRMSNorm, 0.0, "llama"
        elif isinstance(m, modeling_llama.LlamaMLP):
            m.__class__ = LigerSwiGLUMLP
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_liger_layers_in_torch_give_the_models_own_logits_to_the_bit(dtype):
    plain = tiny_causal_lm(32, seed=3).to(dtype)
    patched = _as_liger(tiny_causal_lm(32, seed=3).to(dtype))
    ids = torch.tensor([[1, 5, 9, 4, 7, 2]])
    with pytest.raises(ValueError, match="Triton"):
        patched(ids)
    assert liger_torch.to_torch(patched, "the cpu") == 2 * 2 + 1 + 2  # two norms a layer, the final norm, two MLPs
    assert not liger_torch.liger_layers(patched)
    assert torch.equal(patched(ids).logits, plain(ids).logits)


def test_the_casting_modes_and_offset_follow_liger():
    """gemma: (1 + w) * x_hat in float32, cast once; none: in the input's dtype; llama: cast before the weight."""
    norm = LigerRMSNorm(4, eps=0.0)
    norm.weight.data = torch.tensor([0.5, 1.0, 2.0, 0.0])
    x = torch.tensor([[1.0, -1.0, 1.0, -1.0]])  # mean square 1: x_hat = x
    norm.__class__ = liger_torch.TorchRMSNorm
    assert norm(x).tolist() == [[0.5, -1.0, 2.0, -0.0]]
    norm.offset, norm.casting_mode = 1.0, "gemma"
    assert norm(x.to(torch.bfloat16)).tolist() == [[1.5, -2.0, 3.0, -1.0]]
    norm.casting_mode = "none"
    assert norm(x.to(torch.float64)).dtype == torch.float64


def test_a_liger_class_without_a_torch_version_is_refused_by_name():
    model = tiny_causal_lm(32)
    model.model.norm.__class__ = LigerLayerNorm
    with pytest.raises(ConfigError, match=r"liger-kernel's LigerLayerNorm layers .* the cpu has none: start the run"):
        liger_torch.to_torch(model, "the cpu")


def _liger_rope(q, k, cos, sin, *args, **kwargs):
    raise ValueError(TRITON_ON_CPU)


_liger_rope.__module__ = "liger_kernel.transformers.rope"


def _patch_transformers_as_liger(monkeypatch, recorded: bool) -> None:
    """What liger-kernel's apply function does to transformers' Llama module (module-wide), recorded as
    train/liger.py records it, or not; everything put back after the test."""
    monkeypatch.setattr(liger_torch, "ORIGINALS", {})
    for name in ("LlamaRMSNorm", "LlamaMLP", "apply_rotary_pos_emb"):
        monkeypatch.setattr(modeling_llama, name, getattr(modeling_llama, name))
    with liger_torch.recording() if recorded else contextlib.nullcontext():
        modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP = LigerRMSNorm, LigerSwiGLUMLP
        modeling_llama.apply_rotary_pos_emb = _liger_rope


def test_a_cpu_run_after_liger_patched_transformers_trains_with_torchs_ops(tiny_model_dir, tmp_path, monkeypatch):
    """A CPU run in a process where a card run's liger-kernel replaced transformers' Llama classes and rotary
    function (its model is built of liger's classes) trains instead of failing in Triton at its first forward."""
    _patch_transformers_as_liger(monkeypatch, recorded=True)
    tr = make(tiny_model_dir, tmp_path / "run", **{"train.steps": 1, "data.eval_size": 0})
    assert {type(m) for m in tr.model.modules()} >= {liger_torch.TorchRMSNorm, liger_torch.TorchSwiGLUMLP}
    assert modeling_llama.apply_rotary_pos_emb is not _liger_rope and modeling_llama.LlamaMLP is not LigerSwiGLUMLP
    tr.train()
    assert tr.step == 1


def test_an_unrecorded_liger_rebinding_is_refused_by_name(tiny_model_dir, tmp_path, monkeypatch):
    _patch_transformers_as_liger(monkeypatch, recorded=False)
    with pytest.raises(ConfigError) as e:
        make(tiny_model_dir, tmp_path / "run", **{"train.steps": 1, "data.eval_size": 0})
    assert str(e.value) == (
        "transformers.models.llama.modeling_llama.LlamaRMSNorm is liger-kernel's (model.kernels patched transformers "
        "on a card earlier in this process), which runs on CUDA only, and this run's device (cpu) has none: start "
        "the run in a fresh process"
    )


def test_a_rollout_workers_copy_on_the_cpu_takes_torchs_ops():
    """A worker on the CPU beside a trainer on a card unpickles the policy as liger's classes: its copy computes
    with torch's ops (rollout/async_worker.py _policy)."""
    from grpokit.rollout.async_worker import _policy

    model = _as_liger(tiny_causal_lm(32, seed=3))
    init = {"threads": 1, "device": "cpu", "model": model, "deterministic": False, "onednn": False, "kernels": None}
    model, device, moved = _policy(init)
    assert device.type == "cpu" and not moved and not liger_torch.liger_layers(model)
    torch.testing.assert_close(
        model(torch.tensor([[1, 5, 9]])).logits,
        tiny_causal_lm(32, seed=3)(torch.tensor([[1, 5, 9]])).logits,
        rtol=0,
        atol=0,
    )
