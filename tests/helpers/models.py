"""Tiny random models and a character tokenizer, built locally (no downloads).

Every tiny model of the suite comes from ``tiny_causal_lm``: two layers of width 32 (4 heads, 2 KV
heads), untied embeddings unless asked, pad id 0, weights drawn after ``torch.manual_seed(seed)``; tests choose
the architecture, vocabulary, context length and special ids. ``save_tiny_model`` writes one with
its tokenizer to a folder that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load."""

from pathlib import Path

import torch

ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def tiny_causal_lm(
    vocab_size: int,
    *,
    arch: str = "llama",
    seed: int = 0,
    max_positions: int = 128,
    bos_token_id: int | None = None,
    eos_token_id: int = 1,
    tie_word_embeddings: bool = False,
    **extra,
):
    """A two-layer random ``arch`` model; ``extra`` goes to its config (e.g. ``head_dim``)."""
    import transformers

    config_name, model_name = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_name)(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=0,
        tie_word_embeddings=tie_word_embeddings,
        **extra,
    )
    return getattr(transformers, model_name)(cfg)


def save_tiny_model(path, tok, **model) -> Path:
    """``tiny_causal_lm(len(tok), **model)`` and ``tok`` saved to ``path``; returns ``path``."""
    from grpokit.data.tasks.chartok import save_char_tokenizer

    tiny_causal_lm(len(tok), **model).save_pretrained(path)
    save_char_tokenizer(tok, path)
    return Path(path)


def tiny_llama(vocab_size: int = 32, seed: int = 0):
    return tiny_causal_lm(vocab_size, seed=seed, bos_token_id=1, eos_token_id=2).eval()


def tiny_qwen2(seed: int = 0):
    return tiny_causal_lm(32, arch="qwen2", seed=seed, bos_token_id=1, eos_token_id=2).eval()


ALPHABET = "abcdefghij0123456789+=<>/ "


def char_tokenizer():
    """A small character-level fast tokenizer (pad 0, eos 1, no tags), built offline."""
    from grpokit.data.tasks.chartok import build_char_tokenizer

    return build_char_tokenizer(ALPHABET, (), padding_side="right", model_max_length=None)


def perturb_lora_b(model, seed: int, scale: float = 0.5):
    """Give every LoRA B matrix seeded noise (PEFT starts them at zero, which would make the adapters a no-op);
    returns the model."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model


def char_reward_model(tmp_path, n_positions=64, bos=False, chat_template=None, labels=None):
    """A tiny GPT-2 classifier over a character tokenizer (one token per character, "<s>" before every
    text when ``bos`` and special tokens are added; ``chat_template`` its template), saved to ``tmp_path``;
    a reward model (one output), or with ``labels`` (their names) a classifier of that many labels."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import GPT2Config, GPT2ForSequenceClassification, PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<pad>", "<unk>", "<s>"] + list("abcdefghijklmnopqrstuvwxyz ?!"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>")
    fast.chat_template = chat_template
    torch.manual_seed(0)
    heads = {"num_labels": 1} if labels is None else {"id2label": dict(enumerate(labels))}
    config = GPT2Config(
        vocab_size=len(vocab), n_embd=16, n_layer=1, n_head=2, n_positions=n_positions, pad_token_id=0, **heads
    )
    model = GPT2ForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path)
    fast.save_pretrained(tmp_path)
    return model, fast


def reward_logit(model, tok, text, add_special_tokens=False):
    """``model``'s first logit on ``text`` alone, tokenized by ``tok``."""
    import torch

    ids = tok(text, add_special_tokens=add_special_tokens, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits[0, 0].item()
