"""A LoRA run that starts from a trained adapter (a PeftModel given as the model): its KL reference is
that adapter, as TRL's frozen "ref" adapter, not the base with the adapters off; fresh adapters keep the
base (adapters off) as reference, the two being equal then."""

import pytest
import torch

from grpokit.train import lora, reference
from grpokit.train.loop import Trainer
from grpokit.train.token_batch import make_token_batch
from helpers.models import perturb_lora_b
from helpers.runs import ROWS, likes_a, tiny_cfg

LORA = {"model.lora_rank": 4, "model.lora_alpha": 8, "model.lora_target_modules": "[q_proj,v_proj]"}


def peft_model(model_dir, trained: bool):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return perturb_lora_b(model, seed=1, scale=2.0) if trained else model


def run_with(model_dir, out, model, **over):
    cfg = tiny_cfg(model_dir, out, **{**LORA, "algo.beta": 0.1, **over})
    cfg.data.dataset = ""
    return Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True, model=model)


def test_at_base_is_true_for_fresh_adapters_only(tiny_model_dir):
    model = peft_model(tiny_model_dir, trained=False)
    assert lora.at_base(model)  # PEFT starts every B at zero: B A = 0, the base's function
    with torch.no_grad():
        model.base_model.model.model.layers[0].self_attn.v_proj.lora_B["default"].weight[0, 0] = 1e-3
    assert not lora.at_base(model)  # one nonzero entry of one B is enough


def test_a_fresh_embedding_adapter_is_at_the_base_too(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["embed_tokens"])
    )
    names = [n for n, _ in lora.adapter_tensors(model)]
    assert names == [  # an embedding's adapter tensors are named without a trailing ".weight"
        "base_model.model.model.embed_tokens.lora_embedding_A.default",
        "base_model.model.model.embed_tokens.lora_embedding_B.default",
    ]
    assert lora.at_base(model)  # PEFT starts an embedding's A at zero and its B random: B A = 0 all the same
    with torch.no_grad():
        model.base_model.model.model.embed_tokens.lora_embedding_A["default"][0, 0] = 1.0
    assert not lora.at_base(model)


def test_the_starting_adapter_is_in_place_during_the_pass_and_the_trained_one_after(tiny_model_dir):
    model = peft_model(tiny_model_dir, trained=True)
    start = lora.StartingAdapter(model)
    B = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    first = B.detach().clone()
    with torch.no_grad():
        B.add_(1.0)  # "training" moves B by 1 everywhere
    seen = start.run(lambda: B.detach().clone())
    assert torch.equal(seen, first)  # inside the pass: the adapter as it started
    assert torch.equal(B.detach(), first + 1.0)  # after it: the trained adapter, exactly


def test_a_trained_adapter_is_its_runs_reference(tiny_model_dir, tmp_path):
    import copy

    model = peft_model(tiny_model_dir, trained=True)
    start = copy.deepcopy(model)  # the policy as given
    tr = run_with(tiny_model_dir, tmp_path / "run", model, **{"optim.lr": 0.1, "train.steps": 2})
    assert tr.ref_model is None and tr.ref_adapter is not None  # no copy of the base, one of the adapter
    tr.train()
    sb = tr.sample_and_score(2, 4)
    batch = make_token_batch(sb.rollout, tr.tokenizer.pad_token_id)
    ref = reference.reference_logprobs(tr.model, tr.ref_model, batch, tr.logprobs, tr.ref_adapter)
    m = batch.completion_mask.bool()
    expected = tr.logprobs(start, batch)[0]
    assert torch.allclose(ref[m], expected[m], atol=1e-5)  # the starting adapter, after two updates
    with model.disable_adapter():
        base = tr.logprobs(model, batch)[0]
    assert not torch.allclose(ref[m], base[m], atol=1e-3)  # ... and not the base
    assert not torch.allclose(tr.logprobs(model, batch)[0][m], expected[m], atol=1e-5)  # the policy moved


def test_the_first_steps_kl_is_zero_from_a_trained_adapter(tiny_model_dir, tmp_path):
    # Before the first update the policy is the starting adapter, so pi == pi_ref token by token and
    # the k3 estimate exp(r) - r - 1 with r = log pi_ref - log pi = 0 is 0 (TRL: kl 0.0 at step 1). Measured
    # against the base (the adapters off), as before, it was 0.017 on this adapter (B ~ N(0, 4)).
    tr = run_with(tiny_model_dir, tmp_path / "run", peft_model(tiny_model_dir, trained=True), **{"train.steps": 1})
    assert tr.train_step()["kl"] == pytest.approx(0.0, abs=1e-7)


def test_fresh_adapters_keep_the_base_as_reference_without_a_copy(tiny_model_dir, tmp_path):
    tr = run_with(tiny_model_dir, tmp_path / "fresh", peft_model(tiny_model_dir, trained=False))
    assert tr.ref_adapter is None  # zero B: the base with the adapters off is the same policy, and cheaper
    tr = run_with(tiny_model_dir, tmp_path / "nokl", peft_model(tiny_model_dir, trained=True), **{"algo.beta": 0.0})
    assert tr.ref_adapter is None  # no KL term, no reference
