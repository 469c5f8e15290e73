"""A reward model given to grpokit.trl's GRPOTrainer by folder scores as TRL 1.16's _calculate_rewards:
the chat template over prompt + completion (with chat_template_kwargs; a tokenizer without one refused on
conversational data, as TRL fails), tokenized without special tokens and without truncation; the reward is the
first logit (a folder loaded with one output, as TRL loads it), computed on the run's device."""

import pytest
from datasets import Dataset

from grpokit.trl.inputs import reward_funcs_of
from grpokit.trl.reward_model import RewardModel
from helpers.models import char_reward_model, reward_logit
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": "say ab"}]}] * 2)
TEMPLATE = "{% if shout %}!{% endif %}{% for m in messages %}{{ m['content'] }} {% endfor %}"


def test_no_special_tokens_no_truncation_and_the_template_kwargs(tmp_path):
    model, tok = char_reward_model(tmp_path, n_positions=256, bos=True, chat_template=TEMPLATE)
    (rm,) = reward_funcs_of([str(tmp_path)], chat_template_kwargs={"shout": True})
    rm.scorer.max_length = 8  # grpokit's own cut would keep 8 tokens; TRL's path cuts nothing
    prompts = [[{"role": "user", "content": "say ab " * 10}]] * 2
    completions = [[{"role": "assistant", "content": "ab"}], [{"role": "assistant", "content": "no"}]]
    got = rm(prompts, completions)
    # the template writes "!" (shout), each message's content and a space; no "<s>" is added before it
    want = [reward_logit(model, tok, "!" + "say ab " * 10 + " " + c + " ") for c in ("ab", "no")]
    assert got == pytest.approx(want, abs=1e-5)
    with_bos = reward_logit(model, tok, "!" + "say ab " * 10 + " ab ", add_special_tokens=True)
    assert got[0] != pytest.approx(with_bos, abs=1e-5)  # the doubled-BOS reading differs


def test_text_prompts_are_prompt_plus_completion(tmp_path):
    model, tok = char_reward_model(tmp_path, bos=True)
    rm = RewardModel(str(tmp_path))
    assert rm(["hi "], ["yes"]) == pytest.approx([reward_logit(model, tok, "hi yes")], abs=1e-5)


def test_a_two_label_folder_is_refused_as_trls_load_fails(tmp_path, chat_model):
    """TRL loads a reward model folder with num_labels=1, which a 2-label head does not fit: its constructor
    fails; grpokit.trl refuses in one sentence naming the labels (before, logit 0 was scored silently)."""
    from grpokit.config.sections import ConfigError

    char_reward_model(tmp_path / "rm2", labels=["NEGATIVE", "POSITIVE"])
    with pytest.raises(ConfigError, match=r"is a classifier with 2 labels \(0: NEGATIVE, 1: POSITIVE\)"):
        RewardModel(str(tmp_path / "rm2"))
    trl = pytest.importorskip("trl")
    with pytest.raises(RuntimeError, match="mismatched|ignore_mismatched_sizes"):
        trl.GRPOTrainer(
            chat_model,
            reward_funcs=[str(tmp_path / "rm2")],
            args=small_args(trl.GRPOConfig, tmp_path / "out", report_to="none"),
            train_dataset=DATA,
        )


def test_a_two_label_object_is_scored_on_its_first_logit_as_trl_with_a_warning(tmp_path, caplog):
    """TRL scores a reward model object with ``logits[:, 0]`` whatever its labels; grpokit.trl does the same and
    says so once, naming the labels (a classifier's first label is seldom a reward)."""
    torch = pytest.importorskip("torch")
    model, tok = char_reward_model(tmp_path, labels=["NEGATIVE", "POSITIVE"])
    model.config._name_or_path = str(tmp_path)
    with caplog.at_level("WARNING", logger="grpokit.trl"):
        rm = RewardModel(model)
    assert any(
        "2 labels (0: NEGATIVE, 1: POSITIVE); it is scored on its first logit" in r.message for r in caplog.records
    )
    ids = tok("hi yes", add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = model(input_ids=ids).logits[0, 0].item()  # TRL's logits[:, 0]
    assert rm(["hi "], ["yes"]) == pytest.approx([want], abs=1e-5)


def test_conversational_data_needs_the_reward_tokenizers_chat_template(tmp_path):
    """TRL applies the reward tokenizer's chat template to conversational rows and raises without one; before,
    grpokit.trl scored an invented text (the messages joined by newlines). Refused before step 1 when the
    training rows are conversational, and at the call for any other batch; text prompts need no template."""
    from grpokit.config.sections import ConfigError
    from grpokit.rewards.errors import RewardInfrastructureError
    from grpokit.trl.reward_model import check_reward_templates

    _, tok = char_reward_model(tmp_path)
    (rm,) = reward_funcs_of([str(tmp_path)])
    assert not rm.templated()
    sentence = r"^reward model '.*' scores conversational prompts through its tokenizer's chat template, and its"
    with pytest.raises(ConfigError, match=sentence + r".*reward_processing_classes"):
        check_reward_templates([rm], [{"prompt": [{"role": "user", "content": "hi"}]}])
    check_reward_templates([rm], [{"prompt": "hi"}])  # text rows are scored as prompt + completion
    with pytest.raises(RewardInfrastructureError, match=sentence):
        rm([[{"role": "user", "content": "hi"}]], [[{"role": "assistant", "content": "yes"}]])
    assert len(rm(["hi "], ["yes"])) == 1
    data_utils = pytest.importorskip("trl.data_utils")  # TRL's own step fails on this tokenizer
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    with pytest.raises(ValueError, match="chat_template"):
        data_utils.apply_chat_template({"messages": messages}, tok)


def test_a_reward_model_scores_on_the_runs_device(tmp_path, chat_model, monkeypatch):
    """TRL's accelerator puts a reward model on the trainer's device; grpokit.trl's reward model asks the run's
    device at each call (no GPU needed: the choice is read, CUDA's presence faked). Before, every reward model
    object was moved to the CPU."""
    import torch

    from grpokit.trl import GRPOConfig, GRPOTrainer

    char_reward_model(tmp_path / "rm", chat_template=TEMPLATE)
    built = {}
    for use_cpu in (False, True):
        args = small_args(GRPOConfig, tmp_path / f"out{use_cpu}", report_to="none", use_cpu=use_cpu)
        built[use_cpu] = GRPOTrainer(chat_model, reward_funcs=[str(tmp_path / "rm")], args=args, train_dataset=DATA)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the device is asked when the model scores
    assert torch.device(built[False].reward_funcs[0].device_of()).type == "cuda"
    assert torch.device(built[True].reward_funcs[0].device_of()).type == "cpu"  # use_cpu=True: the CPU
