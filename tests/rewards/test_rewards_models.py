"""Learned rewards with a tiny randomly initialised model built here (no downloads)."""

import pytest

from grpokit.rewards.models import NewlineStepReward, SequenceClassifierReward


def _char_decode(ids):
    return "".join(chr(i) for i in ids)


def test_sequence_classifier_reward_is_batched_and_deterministic(tmp_path):
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2ForSequenceClassification, PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<pad>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz ?!"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=1, n_head=2, n_positions=64, num_labels=1, pad_token_id=0)
    )
    model.save_pretrained(tmp_path)
    fast.save_pretrained(tmp_path)
    rm = SequenceClassifierReward(str(tmp_path), batch_size=2)
    prompts, completions = ["what?", "what?", "hi"], ["yes", "no no", "abc"]
    scores = rm(prompts, completions)
    assert len(scores) == 3 and all(isinstance(s, float) for s in scores)
    # batching (and padding) does not change a score: score each alone
    alone = [rm([p], [c])[0] for p, c in zip(prompts, completions)]
    assert scores == pytest.approx(alone, abs=1e-5)


def test_newline_step_reward_positions_and_scores():
    text = "ab\ncd\n\nef"
    ids = [ord(c) for c in text]  # one token per character
    prm = NewlineStepReward(lambda prompt, previous, step, **row: float(step == row["good"]), _char_decode)
    steps = prm(["p"], [text], [ids], good=["cd"])
    # "ab" ends at char 2 -> token 1; "cd" ends at char 5 -> token 4; the empty line is skipped;
    # "ef" ends at char 9 -> token 8 (the last token)
    assert steps == [[(1, 0.0), (4, 1.0), (8, 0.0)]]
