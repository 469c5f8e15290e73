"""Learned rewards with a tiny randomly initialised model built here (no downloads)."""

import pytest

from grpokit.rewards.models import NewlineStepReward, SequenceClassifierReward
from helpers.models import char_reward_model, reward_logit


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


def test_a_text_beyond_the_models_length_keeps_its_end_and_says_so_once(tmp_path, caplog):
    """n_positions 64: the limit is 64 tokens (one per character). A 90-character prompt + completion is
    scored on its last 64 characters, the completion's end, so two completions that differ only at the end
    score differently; the warning comes once for the two calls."""
    model, tok = char_reward_model(tmp_path)
    rm = SequenceClassifierReward(str(tmp_path))
    assert rm.max_length == 64
    prompt = "ab " * 29  # 87 characters
    with caplog.at_level("WARNING"):
        a, b = rm([prompt, prompt], ["yes", "no!"])
        rm([prompt], ["yes"])
    assert a == pytest.approx(reward_logit(model, tok, (prompt + "yes")[-64:]), abs=1e-5)
    assert b == pytest.approx(reward_logit(model, tok, (prompt + "no!")[-64:]), abs=1e-5)
    assert a != pytest.approx(b)
    warned = [r for r in caplog.records if "longer than its max_length 64" in r.getMessage()]
    assert len(warned) == 1 and "90 tokens" in warned[0].getMessage()
    # a text within the limit is scored whole, with the tokenizer's special tokens as before
    assert rm(["hi "], ["yes"])[0] == pytest.approx(
        reward_logit(model, tok, "hi yes", add_special_tokens=True), abs=1e-5
    )
