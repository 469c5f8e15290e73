"""Shared fixtures: a tiny random causal LM built locally (no downloads)."""

import pytest
import torch


def tiny_llama(vocab_size: int = 32, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def tiny_model():
    return tiny_llama()
