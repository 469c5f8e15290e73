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


def test_a_classifier_of_several_labels_is_refused_unless_a_label_is_picked(tmp_path):
    """A reward model has one output: a folder is loaded with num_labels=1 (as TRL loads a reward model),
    so a saved 2-label head does not fit and is refused in one sentence naming its labels; before, logit 0
    (NEGATIVE here) was scored silently. label_index picks a label of a classifier, and must be one."""
    from grpokit.config.sections import ConfigError

    model, tok = char_reward_model(tmp_path, labels=["NEGATIVE", "POSITIVE"])
    model.config._name_or_path = str(tmp_path)  # an object's tokenizer is read from its folder
    with pytest.raises(ConfigError, match=r"is a classifier with 2 labels \(0: NEGATIVE, 1: POSITIVE\), not a reward"):
        SequenceClassifierReward(str(tmp_path))
    with pytest.raises(ConfigError, match=r"is a classifier with 2 labels"):
        SequenceClassifierReward(None, model=model)  # an object too
    with pytest.raises(ConfigError, match=r"^label_index=2 is no label of .*0: NEGATIVE, 1: POSITIVE"):
        SequenceClassifierReward(str(tmp_path), label_index=2)
    positive = SequenceClassifierReward(str(tmp_path), label_index=1)
    torch = pytest.importorskip("torch")
    ids = tok("hi yes", add_special_tokens=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = model(input_ids=ids).logits[0, 1].item()  # the POSITIVE logit
    assert positive(["hi "], ["yes"])[0] == pytest.approx(want, abs=1e-5)


def test_a_folder_without_a_classification_head_gets_one_output_as_under_trl(tmp_path):
    """A causal LM's folder has no score head (its config says 2 labels, the default): loaded as TRL loads
    it (num_labels=1), it gets a new one-output head and is scored, not refused."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tok = char_reward_model(tmp_path / "tok")
    config = GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=64, pad_token_id=0)
    assert config.num_labels == 2
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    rm = SequenceClassifierReward(str(tmp_path / "lm"))
    assert rm.model.config.num_labels == 1 and len(rm(["hi "], ["yes"])) == 1


def test_a_model_object_scores_where_it_is_unless_told(tmp_path):
    """device=None keeps a model object where the user put it (here the meta device, which a move to the CPU
    could not even copy: before, every object was moved to the CPU); place() moves it when told."""
    torch = pytest.importorskip("torch")
    from transformers import GPT2ForSequenceClassification

    model, _ = char_reward_model(tmp_path)
    model.config._name_or_path = str(tmp_path)  # an object's tokenizer is read from its folder
    with torch.device("meta"):
        on_meta = GPT2ForSequenceClassification(model.config)
    rm = SequenceClassifierReward(None, model=on_meta)
    assert rm.device == torch.device("meta") and next(rm.model.parameters()).is_meta
    on_cpu = SequenceClassifierReward(None, model=model)
    assert on_cpu.device == torch.device("cpu")
    on_cpu.place(None)  # no device named: it stays
    assert on_cpu.device == torch.device("cpu")
    on_cpu.place("meta")
    assert on_cpu.device == torch.device("meta") and next(on_cpu.model.parameters()).is_meta


def test_a_classifiers_labels_are_named_by_one_rule():
    """label_list names a classifier's labels wherever a sentence does (rewards/models.py's refusals, grpokit.trl's
    warning for a reward model object of several labels): "index: name", the index itself where id2label has no
    name for it."""
    from types import SimpleNamespace

    from grpokit.rewards.models import label_list

    assert (
        label_list(SimpleNamespace(num_labels=2, id2label={0: "NEGATIVE", 1: "POSITIVE"})) == "0: NEGATIVE, 1: POSITIVE"
    )
    assert label_list(SimpleNamespace(num_labels=3, id2label={1: "ok"})) == "0: 0, 1: ok, 2: 2"
