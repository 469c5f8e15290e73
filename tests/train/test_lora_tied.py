"""Tied embeddings (one weight for the input embeddings and the output layer, as Qwen2.5-0.5B and SmolLM2)
with an adapter on lm_head or embed_tokens: the merged checkpoint and ``grpokit eval``'s merged model
compute what was trained. PEFT's merge alone writes the head's update into the shared weight, so into the
embeddings too (logits off by up to 17 here), and the embeddings' update into the head (off by 99)."""

import json

import pytest
import torch

from grpokit.config import ModelConfig
from helpers.models import char_tokenizer, save_tiny_model
from helpers.runs import make

IDS = torch.tensor([[3, 4, 5, 6, 7]])


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tied"), char_tokenizer(), tie_word_embeddings=True)


def trained(tied_dir, out, targets, save="merged"):
    over = {"model.lora_rank": 4, "model.lora_target_modules": targets, "model.lora_save": save}
    tr = make(tied_dir, out, **over, **{"train.steps": 2, "train.save_every": 2, "optim.lr": 0.1})
    tr.train()
    with torch.no_grad():
        live = tr.model(input_ids=IDS).logits
    return tr, live, out / "checkpoints" / "step-000002"


@pytest.mark.parametrize("targets", ["[q_proj,lm_head]", "[embed_tokens,q_proj]"])
def test_the_merged_checkpoint_computes_the_trained_policy(tied_dir, tmp_path, targets):
    from transformers import AutoModelForCausalLM

    tr, live, ckpt = trained(tied_dir, tmp_path / "run", targets)
    assert tr.model.get_base_model().config.tie_word_embeddings  # the live model stays as it was
    loaded = AutoModelForCausalLM.from_pretrained(ckpt / "model")
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=IDS).logits, live, atol=1e-5)
    assert json.loads((ckpt / "model" / "config.json").read_text())["tie_word_embeddings"] is False
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()  # its own head


def test_eval_of_an_adapter_checkpoint_computes_the_trained_policy(tied_dir, tmp_path):
    from grpokit.cli import eval as ev

    _, live, _ = trained(tied_dir, tmp_path / "run", "[q_proj,lm_head]", save="adapter")
    base, adapter, _ = ev.resolve_model(str(tmp_path / "run"))
    model, _ = ev.load_eval_model(ModelConfig(name_or_path=base), adapter, torch.device("cpu"))
    with torch.no_grad():
        assert torch.allclose(model(input_ids=IDS).logits, live, atol=1e-5)  # 17 apart before


def test_a_tied_model_whose_embeddings_carry_no_adapter_stays_tied(tied_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    _, live, ckpt = trained(tied_dir, tmp_path / "run", "[q_proj]")
    assert json.loads((ckpt / "model" / "config.json").read_text())["tie_word_embeddings"] is True
    with torch.no_grad():
        assert torch.allclose(
            AutoModelForCausalLM.from_pretrained(ckpt / "model")(input_ids=IDS).logits, live, atol=1e-5
        )


@pytest.mark.parametrize("backend", ["vllm", "vllm_server"])
def test_vllm_cannot_sample_a_tied_model_with_an_adapted_end(tied_dir, tiny_model_dir, backend):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpokit.config import Config, ConfigError
    from grpokit.train.engines import refuse_vllm_tied_adapter

    cfg = Config()
    cfg.model.lora_rank, cfg.rollout.backend = 4, backend
    wrap = lambda folder, targets: get_peft_model(  # noqa: E731
        AutoModelForCausalLM.from_pretrained(folder), LoraConfig(r=4, target_modules=targets)
    )
    with pytest.raises(ConfigError, match=rf"^rollout.backend={backend} with tied embeddings .* lm_head or embed"):
        refuse_vllm_tied_adapter(cfg, wrap(tied_dir, ["q_proj", "lm_head"]))
    refuse_vllm_tied_adapter(cfg, wrap(tied_dir, ["q_proj"]))  # the shared weight untouched: vLLM's head is right
    refuse_vllm_tied_adapter(cfg, wrap(tiny_model_dir, ["lm_head"]))  # untied: vLLM loads the head's own weight
    cfg.rollout.backend = "hf"
    refuse_vllm_tied_adapter(cfg, wrap(tied_dir, ["embed_tokens"]))  # grpokit's engines compute through adapters
