"""Which parameters weight decay reaches (optim/decay.py): grpokit's one group, or transformers' Trainer's
two groups (optim.decay_norms_and_biases=false, what grpokit.trl sets): worked out by hand on a tiny
model, then checked against transformers' own Trainer.get_decay_parameter_names."""

import torch
from torch import nn
from transformers import Trainer

from grpokit.config import OptimConfig
from grpokit.optim.decay import decays, param_groups
from grpokit.train.update import make_optimizer
from helpers.models import tiny_llama, tiny_qwen2


class RMSNorm(nn.Module):  # not an nn.LayerNorm: transformers catches it by name only
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.mixer = nn.LayerNorm(2)  # a LayerNorm under a name without "norm": caught by its type
        self.input_layernorm = RMSNorm()
        self.gate_norm_proj = nn.Linear(2, 2)  # "_norm" not followed by "." or the end: decayed
        self.normalizer = nn.Linear(2, 2, bias=False)  # "norm" not a whole dotted part: decayed
        self.q_rmsnorm_scale = nn.Parameter(torch.ones(2))  # "rmsnorm" anywhere: not decayed


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(4, 2)
        self.layers = nn.ModuleList([Block()])
        self.norm = RMSNorm()
        self.head = nn.Linear(2, 4, bias=False)
        self.scale = nn.Parameter(torch.ones(1))  # the model's own parameter, no norm in its name: decayed


# by hand, from the rule: inside a LayerNorm, or bias / layernorm / rmsnorm / a part "norm" / "..._norm" ending
# a part, is not decayed
DECAYED = [
    "embed.weight",
    "layers.0.proj.weight",
    "layers.0.gate_norm_proj.weight",
    "layers.0.normalizer.weight",
    "head.weight",
    "scale",
]
NOT_DECAYED = [
    "layers.0.proj.bias",  # bias
    "layers.0.mixer.weight",  # inside nn.LayerNorm
    "layers.0.mixer.bias",
    "layers.0.input_layernorm.weight",  # layernorm
    "layers.0.gate_norm_proj.bias",  # bias
    "layers.0.q_rmsnorm_scale",  # rmsnorm
    "norm.weight",  # the part "norm"
]


def _names(model, group):
    names = {id(p): n for n, p in model.named_parameters()}
    return sorted(names[id(p)] for p in group["params"])


def test_two_groups_by_hand():
    model = Tiny()
    decayed, rest = param_groups(model, 0.1, decay_norms_and_biases=False)
    assert (_names(model, decayed), decayed["weight_decay"]) == (sorted(DECAYED), 0.1)
    assert (_names(model, rest), rest["weight_decay"]) == (sorted(NOT_DECAYED), 0.0)


def test_one_group_of_every_parameter_by_default_and_frozen_ones_left_out():
    model = Tiny()
    model.head.weight.requires_grad_(False)
    (group,) = param_groups(model, 0.1, decay_norms_and_biases=True)
    assert _names(model, group) == sorted(set(DECAYED + NOT_DECAYED) - {"head.weight"})
    assert OptimConfig().decay_norms_and_biases is True  # grpokit's native default is unchanged
    decayed, _ = param_groups(model, 0.1, decay_norms_and_biases=False)
    assert "head.weight" not in _names(model, decayed)


def test_the_groups_are_transformers_get_decay_parameter_names():
    for model in (Tiny(), tiny_llama(), tiny_qwen2()):
        theirs = set(Trainer.get_decay_parameter_names(None, model))  # self is not read
        ours = {n for n, _ in model.named_parameters() if decays(model, n)}
        assert ours == theirs & {n for n, _ in model.named_parameters()}


def test_norm_weights_and_biases_keep_their_value_under_decay():
    """AdamW with weight decay 0.5 and lr 0.1 and zero gradients: a decayed weight is multiplied by
    1 - 0.1 * 0.5 = 0.95 (Adam's step is 0 with a zero gradient), an undecayed one stays."""
    model = Tiny()
    opt, _ = make_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.5, decay_norms_and_biases=False), 1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        assert torch.allclose(p, before[n] * (0.95 if n in DECAYED else 1.0)), n


def test_without_weight_decay_one_group_is_the_same_update():
    """weight_decay 0 decays nothing in either group: one group, as checkpoints saved before the split hold."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    (group,) = param_groups(model, 0.0, decay_norms_and_biases=False)
    assert group["weight_decay"] == 0.0 and len(group["params"]) == 4
