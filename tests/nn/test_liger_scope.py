"""nn/liger_scope.py: liger-kernel's apply function rebinds transformers' classes and rotary function module-wide;
``scoped`` keeps its patch to the policy it was given: the classes put back, each rebound function liger's on CUDA
tensors and the original elsewhere. liger-kernel needs a card, so its rebinding is stood in for here by a function
that rebinds the Llama module's names as liger's apply does (tests/project/test_gpu.py runs the real one)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama import modeling_llama

from grpokit.nn import liger_scope
from helpers.runs import make

NAMES = ("LlamaRMSNorm", "LlamaMLP", "apply_rotary_pos_emb")
TRITON_ON_CPU = "Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)"


class LigerRMSNorm(torch.nn.Module):
    pass


class LigerSwiGLUMLP(torch.nn.Module):
    pass


def liger_rope(q, k, *args, **kwargs):
    if not q.is_cuda:
        raise ValueError(TRITON_ON_CPU)
    return "liger's kernel"


@pytest.fixture
def llama_names(monkeypatch):
    """The Llama module's names as they are, put back after the test whatever it rebinds."""
    originals = {name: getattr(modeling_llama, name) for name in NAMES}
    for name, value in originals.items():
        monkeypatch.setattr(modeling_llama, name, value)
    return originals


def _apply(fail: bool = False):
    """What liger-kernel's apply function does to transformers' Llama module, failing partway where ``fail``."""
    modeling_llama.LlamaRMSNorm, modeling_llama.apply_rotary_pos_emb = LigerRMSNorm, liger_rope
    if fail:
        raise RuntimeError("a liger release that does not fit")
    modeling_llama.LlamaMLP = LigerSwiGLUMLP


class OnCard(torch.Tensor):
    """A CPU tensor that says it is on CUDA: which function OnCuda picks, without a card."""

    @property
    def is_cuda(self):
        return True


def test_classes_go_back_and_the_rotary_function_is_liger_on_cuda_only(llama_names):
    liger_scope.scoped(_apply)
    assert modeling_llama.LlamaRMSNorm is llama_names["LlamaRMSNorm"]
    assert modeling_llama.LlamaMLP is llama_names["LlamaMLP"]
    rope = modeling_llama.apply_rotary_pos_emb
    assert isinstance(rope, liger_scope.OnCuda) and rope.original is llama_names["apply_rotary_pos_emb"]
    q, k, cos, sin = (torch.randn(1, 2, 3, 4) for _ in range(4))
    want = llama_names["apply_rotary_pos_emb"](q, k, cos[:, 0], sin[:, 0])
    got = rope(q, k, cos[:, 0], sin[:, 0])
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert rope(q.as_subclass(OnCard), k, cos, sin) == "liger's kernel"


def test_a_second_patch_wraps_the_original_not_the_first_wrapper(llama_names):
    liger_scope.scoped(_apply)
    liger_scope.scoped(_apply)
    assert modeling_llama.apply_rotary_pos_emb.original is llama_names["apply_rotary_pos_emb"]


def test_a_patch_that_fails_partway_is_scoped_too(llama_names):
    with pytest.raises(RuntimeError, match="does not fit"):
        liger_scope.scoped(lambda: _apply(fail=True))
    assert modeling_llama.LlamaRMSNorm is llama_names["LlamaRMSNorm"]
    assert isinstance(modeling_llama.apply_rotary_pos_emb, liger_scope.OnCuda)


def test_a_cpu_run_after_a_card_runs_patch_trains_on_the_models_own_code(tiny_model_dir, tmp_path, llama_names):
    """A CPU run in a process where a card run's liger-kernel patched transformers' Llama module (a notebook, or a
    reward model on the CPU beside a policy on the card): its model is built of transformers' own classes and its
    attention's rotary function is the original on CPU tensors, so it trains instead of failing in Triton."""
    liger_scope.scoped(_apply)
    tr = make(tiny_model_dir, tmp_path / "run", **{"train.steps": 1, "data.eval_size": 0})
    assert not any(type(m).__name__.startswith("Liger") for m in tr.model.modules())
    tr.train()
    assert tr.step == 1
