"""Tiny random models and a character tokenizer, built locally (no downloads)."""

import torch


def tiny_llama(vocab_size: int = 32, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_qwen2(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg).eval()


ALPHABET = "abcdefghij0123456789+=<>/ "


def char_tokenizer():
    """A small character-level fast tokenizer (pad 0, eos 1, no tags), built offline."""
    from grpokit.data.tasks.chartok import build_char_tokenizer

    return build_char_tokenizer(ALPHABET, (), padding_side="right", model_max_length=None)
