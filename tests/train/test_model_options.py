"""Model options that change the forward (train/model_options.py): the float32 output layer
(ScaleRL, TRL's cast_lm_head_to_fp32), NEFTune noise and the Mixture-of-Experts router loss, on tiny
models built locally with random weights."""

import copy

import pytest
import torch

from grpokit.config import Config, ConfigError, apply_overrides
from grpokit.train.model_options import add_neftune, head_in_float32, noise_on, router_coefficient
from grpokit.validation import validate


def _qwen2(tied: bool, dtype=torch.bfloat16):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(cfg).to(dtype)


def _moe(coef: float = 0.001):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2MoeConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
        router_aux_loss_coef=coef,
    )
    return Qwen2MoeForCausalLM(cfg)


IDS = torch.tensor([[3, 9, 27, 5, 11, 40], [7, 7, 1, 60, 2, 33]])


@pytest.mark.parametrize("tied", [False, True])
def test_lm_head_fp32_gives_float32_logits_of_float32_weights(tied):
    model = _qwen2(tied)
    head_in_float32(model)
    assert model.lm_head.weight.dtype == torch.float32
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16  # the rest stays bf16
    if tied:  # one shared weight: float32 now, while the embeddings still feed the layers bf16
        assert model.model.embed_tokens.weight is model.lm_head.weight
        assert model.model.embed_tokens(IDS).dtype == torch.bfloat16
    out = model(input_ids=IDS, output_hidden_states=True)
    h = out.hidden_states[-1]  # (2, 6, 16) bf16, after the final norm
    assert out.logits.dtype == torch.float32
    # logits = h (cast up) @ W^T in float32: exactly the float32 matmul, not a bf16 one
    assert torch.equal(out.logits, h.float() @ model.lm_head.weight.float().T)
    ref = copy.deepcopy(model)  # the reference policy is a deep copy: its head is its own float32 layer
    ref.lm_head.weight.data.zero_()
    assert ref(input_ids=IDS).logits.abs().max() == 0 and model(input_ids=IDS).logits.abs().max() > 0


def test_lm_head_fp32_refuses_an_adapter_on_the_head():
    cfg = apply_overrides(
        Config(), ["model.lm_head_fp32=true", "model.lora_rank=4", "model.lora_target_modules=[q_proj,lm_head]"]
    )
    with pytest.raises(ConfigError, match="model.lm_head_fp32"):
        validate(cfg)


def test_lm_head_fp32_trains_a_bf16_model(tmp_path):
    # the demo model (tied head) loaded in bfloat16: after one step the head is float32 and has moved
    from grpokit.train.loop import Trainer

    cfg = apply_overrides(
        Config(),
        [
            "train.steps=1",
            "train.prompts_per_step=4",
            "rollout.group_size=4",
            "data.eval_size=0",
            "record.sinks=[jsonl]",
            "record.report=false",
            "train.threads=1",
            "rollout.max_new_tokens=8",
            "model.dtype=bfloat16",
            "model.lm_head_fp32=true",
            "optim.lr=0.01",
            f"train.out={tmp_path}/run",
        ],
    )
    trainer = Trainer(cfg, quiet=True)
    head = trainer.model.get_output_embeddings()
    before = head.weight.detach().clone()
    layer = next(p for n, p in trainer.model.named_parameters() if "layers.0" in n and p.dim() == 2)
    trainer.train()
    assert head.weight.dtype == torch.float32 and layer.dtype == torch.bfloat16
    assert not torch.equal(before, head.weight)


def test_neftune_noise_only_inside_noise_on():
    model = _qwen2(False, torch.float32)
    clean = model.get_input_embeddings()(IDS)
    add_neftune(model, alpha=8.0)
    emb = model.get_input_embeddings()
    assert torch.equal(emb(IDS), clean)  # off until the training step turns it on
    with noise_on(model):
        noisy = emb(IDS)
    # bound alpha / sqrt(L d) = 8 / sqrt(6 * 16) = 0.8165; 192 uniform draws in [-0.8165, 0.8165]
    diff = (noisy - clean).abs()
    assert diff.max() <= 8.0 / (6 * 16) ** 0.5 + 1e-6 and diff.max() > 0.5
    assert torch.equal(emb(IDS), clean)  # off again after the block
    with noise_on(model):  # one decode step of the static engine embeds (n, d): L = 1, bound 8 / sqrt(16) = 2
        step = emb(IDS[:, 0]) - clean[:, 0]
    assert step.shape == (2, 16) and step.abs().max() <= 2.0 + 1e-6 and step.abs().max() > 8.0 / (6 * 16) ** 0.5
    with noise_on(_qwen2(False, torch.float32)):  # a model without NEFTune: nothing to turn on
        pass


def test_router_coefficient_resolves_against_the_model():
    moe, dense = _moe(0.001), _qwen2(False)
    assert router_coefficient(moe, -1) == 0.001  # the config's own (TRL's None)
    assert router_coefficient(moe, 0.5) == 0.5 and router_coefficient(moe, 0) == 0.0
    assert router_coefficient(dense, -1) == 0.0  # no router: nothing to add
    with pytest.raises(ConfigError, match="model.router_aux_loss_coef=0.5"):
        router_coefficient(dense, 0.5)


def test_router_loss_is_added_in_proportion_to_micro_batch_rows():
    # one update on 4 rows, 2 micro-batches of 2 rows: the loss gains coef * (aux_1 * 2/4 + aux_2 * 2/4)
    from grpokit.algo.pipeline import UpdateInputs, loss_settings
    from grpokit.config.sections import AlgoConfig, OptimConfig
    from grpokit.train.logprobs import completion_logprobs, logprobs_with_router_loss
    from grpokit.train.update import Accumulator, Forwards, accumulate, apply_update, make_optimizer
    from grpokit.types import TokenBatch

    ids = torch.cat([IDS, IDS.flip(1)])  # (4, 6): a 2-token prompt and a 4-token completion each
    attn = torch.ones_like(ids)
    batch = TokenBatch(ids, attn, attn.cumsum(1) - 1, ids[:, 2:].clone(), torch.ones(4, 4))
    model = _moe()
    lp, ent, aux = logprobs_with_router_loss(model, batch)
    assert torch.allclose(lp, completion_logprobs(model, batch)[0], atol=1e-6)  # the same log-probs as the chunked path
    auxes = [logprobs_with_router_loss(model, batch.rows(slice(s, s + 2)))[2].item() for s in (0, 2)]
    losses = {}
    for coef in (0.0, 0.3):
        m = copy.deepcopy(model)
        opt, sched = make_optimizer(m, OptimConfig(lr=0.0), 1)
        loss, norms = loss_settings(AlgoConfig())
        inputs = UpdateInputs(
            batch=batch,
            advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
            loss_mask=batch.completion_mask,
            old_logp=None,
            ref_logp=None,
            loss=loss,
            norms=norms,
        )
        acc = Accumulator()
        accumulate(m, opt, inputs, acc, Forwards(temperature=1.0, micro_batch_size=2, router_aux=coef))
        losses[coef] = apply_update(opt, sched, acc, OptimConfig(lr=0.0), router_aux=coef)
    assert losses[0.3]["loss"] - losses[0.0]["loss"] == pytest.approx(0.3 * (auxes[0] + auxes[1]) / 2, rel=1e-5)
    assert (
        losses[0.3]["aux_loss"] == pytest.approx((auxes[0] + auxes[1]) / 2, rel=1e-5) and "aux_loss" not in losses[0.0]
    )


def test_neftune_is_on_in_training_steps_and_off_in_evaluation(tmp_path):
    from grpokit.train.loop import Trainer

    cfg = apply_overrides(
        Config(),
        [
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "data.eval_size=2",
            "record.sinks=[jsonl]",
            "record.report=false",
            "train.threads=1",
            "rollout.max_new_tokens=4",
            "model.neftune_noise_alpha=5",
            f"train.out={tmp_path}/run",
        ],
    )
    trainer = Trainer(cfg, quiet=True)
    seen = []  # the noise switch at every embedding call: evaluation before and after training, then the step
    trainer.model.get_input_embeddings().register_forward_pre_hook(lambda m, a: seen.append(m.grpokit_neftune_on))
    trainer.train()
    assert True in seen and False in seen and seen[0] is False and seen[-1] is False
    assert trainer.model.get_input_embeddings().grpokit_neftune_on is False


# -- model.disable_dropout: pi_old (eval mode) and the update (train mode) are one policy


def _dropout_llama(attention_dropout: float = 0.3):
    from helpers.models import tiny_causal_lm

    return tiny_causal_lm(32, attention_dropout=attention_dropout)


def test_disable_dropout_zeroes_every_dropout_of_the_policy():
    # a two-layer llama with attention_dropout 0.3 (a float each attention layer passes to its kernel in train
    # mode, no Dropout module) and LoRA on q_proj with dropout 0.1 (a Dropout module per adapted layer):
    # 2 attention floats + 2 LoRA modules = 4 probabilities set to 0; the config keeps 0.3 (a checkpoint's own)
    from peft import LoraConfig, get_peft_model

    from grpokit.train.model_options import disable_dropout

    model = get_peft_model(_dropout_llama(), LoraConfig(r=2, lora_dropout=0.1, target_modules=["q_proj"]))
    assert disable_dropout(model) == 4
    dropouts = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(dropouts) == 2 and dropouts == [0.0, 0.0]
    assert [m.attention_dropout for m in model.modules() if hasattr(m, "attention_dropout")] == [0.0, 0.0]
    assert model.config.attention_dropout == 0.3
    assert disable_dropout(model) == 0  # nothing left to change


def test_without_dropout_the_train_mode_forward_is_the_eval_mode_one():
    # the property the ratio needs: pi_old is taken in eval mode, the update's forward in train mode
    from grpokit.train.model_options import disable_dropout

    model, ids = _dropout_llama(), torch.randint(2, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    eval_logits = model.eval()(ids).logits
    torch.manual_seed(0)
    assert not torch.allclose(model.train()(ids).logits, eval_logits)  # dropout 0.3 changes the train-mode pass
    disable_dropout(model)
    assert torch.equal(model.train()(ids).logits, eval_logits)


def test_lora_dropout_needs_disable_dropout_off():
    lora = ["model.lora_rank=4", "model.lora_dropout=0.05"]
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), lora))
    assert str(e.value) == (
        "model.lora_dropout=0.05 would be set to 0 by model.disable_dropout=true (the policy's dropout is off, so "
        "pi_old and the update see one policy); set model.disable_dropout=false to train with LoRA dropout, or "
        "model.lora_dropout=0"
    )
    validate(apply_overrides(Config(), [*lora, "model.disable_dropout=false"]))


def test_a_model_with_dropout_trains_with_ratio_one_before_its_first_update(tmp_path):
    # lr 1e-30: the policy never moves, so every ratio pi / pi_old of both updates of a batch (num_iterations 2)
    # must be 1. With the model's attention dropout 0.3 on, the update's train-mode forward is not the eval-mode
    # pi_old and the ratios scatter around 1 (clipped where they leave [0.8, 1.2]); model.disable_dropout (the
    # default) turns it off
    import json

    from helpers.models import char_tokenizer, save_tiny_model
    from helpers.runs import make

    model_dir = save_tiny_model(tmp_path / "m", char_tokenizer(), attention_dropout=0.3)
    ratios = {}
    for off in (True, False):
        out = tmp_path / f"run-{off}"
        over = {"algo.num_iterations": 2, "optim.lr": 1e-30, "train.steps": 1, "model.disable_dropout": off}
        make(model_dir, out, **over).train()
        ratios[off] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["ratio/mean"]
    assert ratios[True] == 1.0 and ratios[False] != 1.0
