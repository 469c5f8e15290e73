"""Shared-prefix passes (train.packing=prefix_tree): each shared prefix computed once, the same values and
gradients as the unshared passes (float64, tiny Llama and Qwen2, SDPA and eager attention)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import grpokit.train.hidden_states as hidden_states
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.prefix_tree import build_tree, refusal, tokens_saved
from grpokit.train.token_batch import make_token_batch
from grpokit.types import Episode, Rollout
from helpers.models import tiny_causal_lm


def _rollout(episodes=False):
    # prompt A = [1, 5, 6] with G = 3 episodes sharing a first turn [7, 8] (an environment's opening, say),
    # then parting; prompt B = [1, 9] whose 2nd episode continues the 1st one's whole completion
    prompts = [[1, 5, 6], [1, 9]]
    comps = [[7, 8, 3, 4], [7, 8, 3, 10, 11], [7, 8, 12], [2, 3], [2, 3, 4, 4], [13]]
    G = 3
    eps = None
    if episodes:  # rows 0-2: tokens 7, 8 are the environment's (context, no loss)
        eps = [Episode([1] * len(c), [0] * len(c)) for c in comps]
        for i in range(3):
            eps[i] = Episode([0, 0] + [1] * (len(comps[i]) - 2), [0, 0] + [1] * (len(comps[i]) - 2))
    return Rollout(prompts, comps, [[0.0] * len(c) for c in comps], ["length"] * 6, G, eps)


def test_tree_hand_example():
    # row 0: 1 5 6 7 8 3 4           nodes 0..6 (7 new)
    # row 1: 1 5 6 7 8 3 | 10 11     shares 6 nodes, adds 7, 8 (10, 11)
    # row 2: 1 5 6 7 8 | 12          shares 5, adds 9 (12)
    # row 3: 1 9 2 3                 shares node 0 (token 1), adds 10..12
    # row 4: 1 9 2 3 | 4 4           shares 4, adds 13, 14
    # row 5: 1 9 | 13                shares 2, adds 15
    # 16 distinct tokens of 7 + 8 + 6 + 4 + 6 + 3 = 34 real ones: 18 saved
    tree = build_tree(make_token_batch(_rollout(), pad_token_id=0))
    assert tree.packed.input_ids[0].tolist() == [1, 5, 6, 7, 8, 3, 4, 10, 11, 12, 9, 2, 3, 4, 4, 13]
    assert tree.packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 6, 7, 5, 1, 2, 3, 4, 5, 2]
    assert tree.saved == 18
    # node 7 (token 10 of row 1) sees its path 0-5 and itself, not node 6 (row 0's token 4)
    assert tree.ancestors[7].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 7]
    # row 2's completion [7, 8, 12] is predicted at nodes 2 (token 6), 3, 4; row 0's first completion token too
    assert tree.packed.state_index[:9].tolist() == [2, 3, 4, 5] + [2, 3, 4, 5, 7]
    assert tree.packed.state_index[9:12].tolist() == [2, 3, 4]
    assert tree.packed.targets[9:12].tolist() == [7, 8, 12]


def _models():
    llama = tiny_causal_lm(16, max_positions=64)
    qwen = tiny_causal_lm(16, arch="qwen2", max_positions=64, tie_word_embeddings=True)
    return [m.double() for m in (llama, qwen)]


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_prefix_tree_equals_unshared_values_and_gradients_float64(monkeypatch, kernel):

    monkeypatch.setattr(hidden_states, "PROMPT_SHARING_TYPES", ())  # the reference: every row computes its own prompt
    for episodes in (False, True) if kernel == "sdpa" else (True,):  # eager: the multi-turn case, Llama and Qwen2
        batch = make_token_batch(_rollout(episodes), pad_token_id=0)
        m = batch.completion_mask.double()
        adv = torch.linspace(-1, 1, m.numel(), dtype=torch.float64).view_as(m)
        for model in _models():
            model.config._attn_implementation = kernel
            out = {}
            for tree in (False, True):
                model.zero_grad()
                # the reference: padded rows, or packed ones under eager attention (its padded float64 rows get
                # NaN from fully masked padding queries, a transformers matter that packing avoids)
                lp, ent = completion_logprobs(
                    model,
                    batch,
                    packed=kernel == "eager",
                    prefix_tree=tree,
                    with_entropy=True,
                    entropy_grad=True,
                    temperature=0.7,
                )
                ((lp * adv + 0.1 * ent) * m).sum().backward()
                out[tree] = (lp.detach() * m, ent.detach() * m, [p.grad.clone() for p in model.parameters()])
            # eager attention takes its softmax in float32 (transformers), over a row whose keys the tree
            # orders differently: values agree to float32 there, to float64 under SDPA
            tol = 1e-12 if kernel == "sdpa" else 1e-6
            assert torch.allclose(out[True][0], out[False][0], atol=tol, rtol=0)
            assert torch.allclose(out[True][1], out[False][1], atol=tol, rtol=0)
            # transformers' RMSNorm computes in float32 even in a float64 model: a shared state's gradient,
            # summed over its rows in float64 and cast once, rounds differently from the rows' separate
            # casts, so gradients agree to float32's relative rounding (a mask off the tree is off by O(1))
            for a, b in zip(out[True][2], out[False][2]):
                assert torch.allclose(a, b, atol=1e-6 * float(b.abs().max()), rtol=0)


def test_the_tree_forward_computes_each_shared_token_once():
    batch = make_token_batch(_rollout(), pad_token_id=0)
    model = _models()[0]
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda mod, a, o: seen.append(a[0].numel()))
    with torch.no_grad():
        completion_logprobs(model, batch, prefix_tree=True)
    hook.remove()
    assert seen == [16] and tokens_saved(batch) == 18  # 34 real tokens, 16 distinct prefixes


def test_kernels_without_a_4d_mask_are_refused_in_one_sentence():
    model = _models()[0]
    assert refusal(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "sdpa or eager" in refusal(model) and "flash_attention_2" in refusal(model)
    other = SimpleNamespace(config=SimpleNamespace(model_type="gpt2", _attn_implementation="sdpa"))
    assert "4-D mask" in refusal(other) and "'gpt2'" in refusal(other)


def test_a_mask_that_does_not_follow_the_tree_would_show(monkeypatch):
    # the same row under a plain causal mask (node 7, row 1's token 10, then also sees row 0's token 4)
    import grpokit.train.prefix_tree as P

    batch = make_token_batch(_rollout(), pad_token_id=0)
    model = _models()[0]
    with torch.no_grad():
        good, _ = completion_logprobs(model, batch, prefix_tree=True)
        real = P.build_tree

        def causal(b):
            tree = real(b)
            tree.ancestors = torch.ones_like(tree.ancestors).tril()
            return tree

        monkeypatch.setattr("grpokit.train.logprobs.build_tree", causal)
        bad, _ = completion_logprobs(model, batch, prefix_tree=True)
    m = batch.completion_mask.bool()
    assert (good - bad)[m].abs().max() > 1e-3


def test_a_training_step_with_shared_prefixes_equals_the_padded_step(tmp_path):
    # the demo task: G = 4 completions share each prompt; the same seed samples the same batch
    from helpers.mismatch import mismatch_trainer

    steps = {}
    for packing in ("padded", "prefix_tree"):
        tr = mismatch_trainer(tmp_path / packing, **{"train.packing": packing})
        steps[packing] = tr.train_step()
    pad, tree = steps["padded"], steps["prefix_tree"]
    assert tree["loss"] == pytest.approx(pad["loss"], rel=1e-4, abs=1e-6)
    assert tree["grad_norm"] == pytest.approx(pad["grad_norm"], rel=1e-4)
    assert tree["train/shared_prefix_tokens_saved"] > 0 and "train/shared_prefix_tokens_saved" not in pad


def test_with_the_norm_in_float64_the_gradients_agree_to_float64_rounding(monkeypatch):
    # the tolerance above is transformers' float32 RMSNorm alone: with the norm in the model's dtype the
    # shared-prefix gradients equal the unshared ones to float64 rounding
    import transformers.models.llama.modeling_llama as llama

    def norm(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(llama.LlamaRMSNorm, "forward", norm)
    monkeypatch.setattr(hidden_states, "PROMPT_SHARING_TYPES", ())
    batch = make_token_batch(_rollout(True), pad_token_id=0)
    m = batch.completion_mask.double()
    model = _models()[0]
    grads = []
    for tree in (False, True):
        model.zero_grad()
        lp, _ = completion_logprobs(model, batch, prefix_tree=tree, temperature=0.7)
        (lp * m * torch.linspace(-1, 1, m.numel(), dtype=torch.float64).view_as(m)).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-12 * max(1.0, float(b.abs().max())), rtol=0)


def test_a_trainer_refuses_shared_prefixes_on_a_kernel_without_4d_masks(tmp_path):
    from grpokit.config import ConfigError
    from helpers.mismatch import mismatch_trainer

    with pytest.raises(ConfigError, match="sdpa or eager.*'flex_attention'"):
        mismatch_trainer(tmp_path, **{"train.packing": "prefix_tree", "model.attn_implementation": "flex_attention"})
