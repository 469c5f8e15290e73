"""LoRA on the tiny model: only adapters train, the reference is the base (no copy), adapters and
merged models are saved, resume is exact, gradient checkpointing changes nothing, QLoRA fails
clearly on CPU, and the mixed-precision choice follows the device."""

import math
import shutil

import pytest
import torch

from grpokit.config import Config, ConfigError, ModelConfig
from grpokit.config.io import apply_overrides
from grpokit.train.models import resolve_autocast
from grpokit.validation import validate
from helpers.runs import ROWS, likes_a, make

LORA = {"model.lora_rank": 4, "model.lora_alpha": 8, "train.deterministic": True}


def test_only_adapters_train_and_reference_is_the_base_without_a_copy(tiny_model_dir, tmp_path):
    tr = make(tiny_model_dir, tmp_path / "run", **LORA, **{"algo.beta": 0.04, "train.steps": 2})
    assert tr.ref_model is None  # LoRA: no second copy of the weights
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    trainable = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    tr.train()
    for n, p in tr.model.named_parameters():
        changed = not torch.equal(before[n], p.detach())
        if n not in trainable:
            assert not changed, n  # the base never moves
        elif "lora_B" in n:
            assert changed, n  # B starts at 0 and gets the first gradient (A's is 0 until B moves)
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert '"kl"' in metrics


def test_reference_logprobs_are_the_base_models(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from grpokit.train import reference
    from grpokit.train.token_batch import make_token_batch

    tr = make(tiny_model_dir, tmp_path / "run", **LORA, **{"algo.beta": 0.04})
    with torch.no_grad():  # move the adapters away from zero so policy != base
        for n, p in tr.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)

    sb = tr.sample_and_score(2, 4)
    batch = make_token_batch(sb.rollout, tr.tokenizer.pad_token_id)
    ref = reference.reference_logprobs(tr.model, tr.ref_model, batch, tr.logprobs)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected = tr.logprobs(base, batch)[0]
    policy = tr.logprobs(tr.model, batch)[0]
    m = batch.completion_mask.bool()
    assert torch.allclose(ref[m], expected[m], atol=1e-5)
    assert not torch.allclose(policy[m], expected[m], atol=1e-3)  # the adapters are really on otherwise


@pytest.mark.parametrize("mode", ["adapter", "merged"])
def test_checkpoint_holds_adapter_or_merged_model_and_resume_is_exact(tiny_model_dir, tmp_path, mode):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    over = {**LORA, "model.lora_save": mode, "train.steps": 2, "train.save_every": 1}
    tr = make(tiny_model_dir, tmp_path / "a", **over)
    tr.train()
    final = {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}
    ckpt = tmp_path / "a" / "checkpoints" / "step-000002"
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        live = tr.model(input_ids=ids).logits
    if mode == "adapter":
        assert (ckpt / "model" / "adapter_model.safetensors").exists()
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ckpt / "model")
    else:
        assert (ckpt / "adapter" / "adapter_model.safetensors").exists()
        loaded = AutoModelForCausalLM.from_pretrained(ckpt / "model")  # a plain HF model, adapters folded in
        assert not any("lora" in n for n, _ in loaded.named_parameters())
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, live, atol=1e-5)

    # resume from step 1 in a copy of the run: step 2 must reproduce the adapters exactly
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-000002")
    from grpokit.train.loop import Trainer
    from helpers.runs import tiny_cfg

    cfg2 = tiny_cfg(tiny_model_dir, tmp_path / "b", **over)
    cfg2.data.dataset = ""  # rows are passed directly
    tr2 = Trainer(cfg2, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], resume=tmp_path / "b", quiet=True)
    assert tr2.step == 1
    tr2.train()
    for n, p in tr2.model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach(), final[n]), n


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir, tmp_path):
    for extra in ({}, LORA):
        results = []
        for gc in (False, True):
            tr = make(
                tiny_model_dir,
                tmp_path / f"gc{gc}{len(extra)}",
                **{
                    **extra,
                    "model.gradient_checkpointing": gc,
                    "train.steps": 1,
                    "train.deterministic": True,
                    "optim.adam_eps": 1e-4,
                },
            )  # Adam with eps 1e-8 amplifies float noise in near-zero gradients
            tr.train()
            results.append({n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad})
        for n in results[0]:  # summation order differs: checkpointing turns prompt sharing off
            assert torch.allclose(results[0][n], results[1][n], atol=1e-6), n
        moved = [n for n in results[0] if "lora_B" in n or not extra]
        assert moved


def test_qlora_on_cpu_is_one_clear_sentence(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"model.quantization='4bit' needs a CUDA GPU"):
        make(
            tiny_model_dir,
            tmp_path / "q",
            **{"model.lora_rank": 4, "model.quantization": "4bit", "model.device": "cpu"},
        )


@pytest.mark.parametrize(
    "over, message",
    [
        ({"model.quantization": "4bit"}, "set model.lora_rank > 0"),
        (
            {"model.quantization": "4bit", "model.lora_rank": 4, "rollout.backend": "vllm_server"},
            "with rollout.backend=vllm_server is not supported: vLLM would be sent the 4-bit packed base",
        ),
        (
            {"model.quantization": "4bit", "model.lora_rank": 4, "rollout.backend": "vllm"},
            "with rollout.backend=vllm is not supported",
        ),
        ({"model.lora_save": "both"}, "model.lora_save='both' is not valid"),
        ({"model.lora_rank": -1}, "model.lora_rank=-1 must be >= 0"),
        (
            {"model.lora_rank": 4, "algo.beta": 0.1, "algo.ref_refresh_every": 5},
            "algo.ref_refresh_every needs full fine-tuning",
        ),
        ({"model.autocast": "fp8"}, "model.autocast='fp8' is not valid"),
    ],
)
def test_config_errors_name_field_and_value(over, message):
    cfg = apply_overrides(Config(), [f"{k}={v}" for k, v in over.items()])
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_autocast_choice_follows_device_and_override():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    auto = ModelConfig()
    assert resolve_autocast(auto, cpu, torch.float32) is None  # CPU: fp32, bf16 matmuls are slow there
    assert resolve_autocast(auto, gpu, torch.float32) is torch.bfloat16  # GPU: fp32 master weights, bf16 compute
    assert resolve_autocast(auto, gpu, torch.bfloat16) is None  # already half precision
    assert resolve_autocast(ModelConfig(autocast="off"), gpu, torch.float32) is None
    assert resolve_autocast(ModelConfig(autocast="bfloat16"), cpu, torch.float32) is torch.bfloat16


def test_forced_bf16_autocast_runs_a_step_on_cpu(tiny_model_dir, tmp_path):
    tr = make(tiny_model_dir, tmp_path / "bf", **{"model.autocast": "bfloat16", "train.steps": 1})
    m = tr.train_step()
    assert math.isfinite(m["loss"]) and m["entropy"] > 0
    assert next(tr.model.parameters()).dtype == torch.float32  # autocast changes compute, not weights
