"""A character-level tokenizer that loads back through ``AutoTokenizer.from_pretrained``.

Every character of a fixed alphabet is one token, and the two answer tags are single added tokens
(so ``"<answer>125</answer>"`` costs 5 tokens, not 20: decoding on a CPU pays per token). Ids::

    0 <pad>   1 <eos>   2 <unk>   3 <answer>   4 </answer>   5.. the characters of ALPHABET

Built with the ``tokenizers`` library: a WordLevel model over the characters, a pre-tokenizer that
isolates every character (regex ``.``), and the Fuse decoder so decoding concatenates without
spaces. It is wrapped in transformers' fast tokenizer class and saved as ``tokenizer.json``; the
saved ``tokenizer_config.json`` names the generic ``PreTrainedTokenizerFast`` class (the name both
transformers 4 and 5 resolve; 5 calls it TokenizersBackend), so ``AutoTokenizer`` rebuilds this
exact tokenizer instead of a model-specific one (transformers 5 maps e.g. a Qwen2 checkpoint to
Qwen2Tokenizer and re-derives its vocabulary, which would turn our characters into ``<unk>``).

There is no BOS token and no post-processor: ``tokenizer("57+68=")`` is exactly the 6 character
ids, and tokenizing a completion separately adds nothing either. Padding is on the left by
default (generation); pass ``padding_side="right"`` when batching training sequences.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
TAG_TOKENS = ("<answer>", "</answer>")
ALPHABET = "0123456789+-*= "
"""Characters with their own id. Anything else encodes to ``<unk>``."""
MODEL_MAX_LENGTH = 64
"""Longest sequence the demo model is built for (its ``max_position_embeddings``)."""


def build_char_tokenizer(
    alphabet: str = ALPHABET,
    tags: tuple[str, ...] = TAG_TOKENS,
    *,
    padding_side: str = "left",
    model_max_length: int | None = MODEL_MAX_LENGTH,
) -> PreTrainedTokenizerFast:
    """A fresh tokenizer: ids 0-2 for pad/eos/unk, then ``tags``, then one id per character of
    ``alphabet`` (deterministic: same ids every time). The defaults are the demo model's; tests and
    the benchmark build other small character vocabularies with the same function."""
    tokens = list(SPECIAL_TOKENS) + list(tags) + list(alphabet)
    vocab = {token: i for i, token in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    # Special tokens are dropped by decode(skip_special_tokens=True); the tags are ordinary added
    # tokens so that they survive decoding (the reward needs to see them).
    core.add_special_tokens(list(SPECIAL_TOKENS))
    if tags:
        core.add_tokens(list(tags))
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, pad_token=PAD, unk_token=UNK, padding_side=padding_side, **extra
    )


def save_char_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: str | Path) -> None:
    """Save ``tokenizer`` to ``folder`` so that ``AutoTokenizer.from_pretrained(folder)`` restores it.

    transformers 5 records its own class name (TokenizersBackend), which transformers 4 cannot
    import; we record the name both understand.
    """
    tokenizer.save_pretrained(folder)
    config_path = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
