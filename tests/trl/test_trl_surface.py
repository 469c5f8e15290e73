"""GRPOTrainer's attributes and helpers that TRL's own tests read (grpokit/trl/contract/surface.py)."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from grpokit.trl import GRPOConfig, GRPOTrainer
from grpokit.trl.contract.surface import add_to_logs, high_entropy_mask, new_logs
from helpers.trl_models import make_chat_model, save_tiny_reward_model

E = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
M = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])  # 10 real tokens: 0.1 .. 1.0


def test_high_entropy_mask_at_quantiles_one_zero_and_between():
    # quantile 1.0 of the real entropies is their maximum 1.0: only that token (row 1, col 3)
    assert high_entropy_mask(E, M, 1.0).tolist() == [[False] * 6, [False, False, False, True, False, False]]
    # quantile 0.0 is the minimum 0.1: every real token, never the padding (1.1, 1.2)
    assert high_entropy_mask(E, M, 0.0).tolist() == M.bool().tolist()
    # quantile 0.8 of 10 sorted values: position 0.8 * 9 = 7.2 -> 0.8 + 0.2 * 0.1 = 0.82: 0.9 and 1.0 stay
    assert high_entropy_mask(E, M, 0.8).tolist() == [[False] * 6, [False, False, True, True, False, False]]
    # no real token: nothing
    assert not high_entropy_mask(E, torch.zeros_like(M), 0.5).any()
    # the trainer's method is this function (TRL's tests call it unbound on a mock)
    assert GRPOTrainer.get_high_entropy_mask(None, E, M, 1.0).sum().item() == 1


class _Batch:  # the fields of rollout/collect.py's ScoredBatch that _logs reads
    group_size, names = 2, ["a", "b"]
    prompts = [type("P", (), {"text": "p0"})(), type("P", (), {"text": "p1"})()]
    texts = ["c0", "c1", "c2", "c3"]
    rewards_NF = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 1.0], [2.0, 1.0]])
    total_N = torch.tensor([1.0, 3.0, 3.0, 3.0])
    extra = {"len": [2, 2, 2, 2]}
    rollout = type("R", (), {"episodes": None})()  # plain completions: every row's prompt is its group's


def test_logs_hold_the_latest_completions_with_rewards_advantages_and_extra():
    logs = new_logs(maxlen=3)
    add_to_logs(logs, _Batch(), torch.tensor([-0.7, 0.7, 0.0, 0.0]))
    # maxlen 3 keeps the last three completions; prompt of row i is prompt i // 2
    assert list(logs["prompt"]) == ["p0", "p1", "p1"] and list(logs["completion"]) == ["c1", "c2", "c3"]
    assert list(logs["rewards"]["a"]) == [3.0, 2.0, 2.0] and list(logs["rewards"]["b"]) == [0.0, 1.0, 1.0]
    # the advantages given, those trained (not recomputed from the totals); the last three kept
    assert list(logs["advantages"]) == pytest.approx([0.7, 0.0, 0.0])
    assert list(logs["extra"]["len"]) == [2, 2, 2] and len(logs["images"]) == 0


def named(completions, **kwargs):
    return [0.0] * len(completions)


def one_step_args(tmp_path, **kw):
    """One CPU step of 1 prompt x 2 completions of at most 2 tokens, writing to ``tmp_path / "run"``."""
    return GRPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=2,
        use_cpu=True,
        report_to="none",
        **kw,
    )


def test_trainer_attributes_trl_scripts_read(tmp_path):
    model = make_chat_model(tmp_path / "m")
    data = Dataset.from_list([{"prompt": "say ab"}, {"prompt": "say cd"}])
    a = one_step_args(tmp_path, reward_weights=[0.5])
    tr = GRPOTrainer(str(model), reward_funcs=[named], args=a, train_dataset=data)
    assert tr.aux_loss_enabled is False and tr.router_aux_loss_coef == 0.0  # a dense model: no router loss to add
    assert tr.reward_func_names == ["named"] and tr.reward_processing_classes == [None]
    assert tr.reward_weights.tolist() == [0.5]
    tr.train()
    # one step of 1 prompt x 2 completions (2 per device / G=2): both in _logs, maxlen 2 (2 x 1 accumulation)
    assert len(tr._logs["completion"]) == 2 and list(tr._logs["rewards"]["named"]) == [0.0, 0.0]


def test_a_peft_model_given_as_the_model_trains_its_own_adapters(tmp_path):
    import pytest
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpokit.config import ConfigError

    folder = make_chat_model(tmp_path / "m")
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(folder)), LoraConfig(r=4, target_modules=["q_proj"])
    )
    data = Dataset.from_list([{"prompt": "say ab"}, {"prompt": "say cd"}])
    a = one_step_args(tmp_path, learning_rate=0.1)
    with pytest.raises(ConfigError, match="^model is already a PeftModel and peft_config is set too"):
        GRPOTrainer(model, reward_funcs=[_varied], args=a, train_dataset=data, peft_config=LoraConfig())
    tr = GRPOTrainer(model, reward_funcs=[_varied], args=a, train_dataset=data)
    assert (tr.cfg.model.lora_rank, tr.cfg.model.lora_target_modules) == (
        4,
        ["q_proj"],
    )  # read from the model's adapters
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tr.train()
    assert tr.model is model  # trained in place, not wrapped a second time
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    # lr 0.1 with rewards that differ within the group: only the LoRA B (and A) matrices move, the base stays
    assert changed and all("lora_" in n for n in changed)


def _varied(completions, **kwargs):
    return [float(i) for i in range(len(completions))]  # 0, 1: unequal in each group, a nonzero advantage


def test_a_model_with_its_own_code_is_refused_at_construction_without_trust_remote_code(tmp_path):
    import json

    import pytest

    from grpokit.config import ConfigError

    folder = tmp_path / "remote"
    folder.mkdir()  # a config whose class lives in the folder's own code (auto_map), of no type transformers knows
    (folder / "config.json").write_text(
        json.dumps(
            {"model_type": "grpokit_remote_test", "auto_map": {"AutoConfig": "configuration_remote.RemoteConfig"}}
        )
    )
    data = Dataset.from_list([{"prompt": "say ab"}])
    a = GRPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, num_generations=2, report_to="none")
    with pytest.raises(
        ConfigError, match=r"contains custom code; pass trust_remote_code=True"
    ):  # TRL: ValueError "custom code"
        GRPOTrainer(str(folder), reward_funcs=[_varied], args=a, train_dataset=data)


def test_evaluate_a_streamed_eval_set_with_one_generation_per_prompt(tmp_path):
    model = make_chat_model(tmp_path / "m")
    data = Dataset.from_list([{"prompt": "say ab"}, {"prompt": "say cd"}])
    a = one_step_args(tmp_path, per_device_eval_batch_size=2, num_generations_eval=1)
    tr = GRPOTrainer(
        str(model), reward_funcs=[_varied], args=a, train_dataset=data, eval_dataset=data.to_iterable_dataset()
    )  # a stream: read to its end at each evaluation
    ev = tr.evaluate()
    # one completion per prompt is its own group mean: advantage 0, so the on-policy loss is exactly 0 (beta 0),
    # and the group std is 0 (TRL's rule for num_generations_eval=1: every completion counts in
    # frac_reward_zero_std); _varied is called once for the eval batch of two completions, as TRL calls it, and
    # gives them 0.0 and 1.0, whose batch std (TRL's reward_std, Bessel-corrected) is sqrt(0.5)
    assert (ev["eval_loss"], ev["eval_reward"], ev["eval_frac_reward_zero_std"]) == (0.0, 0.5, 1.0)
    assert ev["eval_reward_std"] == pytest.approx(0.5**0.5)


def _none(completions, **kwargs):
    return [None] * len(completions)


def test_trl_warnings_sequence_level_with_a_summed_loss_and_all_rewards_none(tmp_path, caplog):
    import logging

    model = make_chat_model(tmp_path / "m")
    data = Dataset.from_list([{"prompt": "say ab"}, {"prompt": "say cd"}])
    with caplog.at_level(logging.WARNING):
        a = one_step_args(tmp_path, importance_sampling_level="sequence", loss_type="grpo")
        GRPOTrainer(str(model), reward_funcs=[_none], args=a, train_dataset=data)
    assert "weights each sequence by its completion length" not in caplog.text  # grpo: GSPO's own setting
    with caplog.at_level(logging.WARNING):
        a = one_step_args(tmp_path, importance_sampling_level="sequence", loss_type="dapo")
        tr = GRPOTrainer(str(model), reward_funcs=[_none], args=a, train_dataset=data)
    assert "weights each sequence by its completion length" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        tr.train()
    # the one step scores 1 prompt x 2 completions, both None from the only function: one warning naming 2
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("All reward functions returned None")]
    assert len(warned) == 1 and "2 completion(s) of this batch have no reward" in warned[0]


def test_a_reward_model_object_with_its_own_tokenizer_scores_up_to_that_tokenizers_pad(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    chat = make_chat_model(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(chat)
    save_tiny_reward_model(tmp_path / "rm", tok)
    rm = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")  # an object, as TRL accepts
    rtok = AutoTokenizer.from_pretrained(tmp_path / "rm")
    rtok.pad_token = rtok.convert_ids_to_tokens(3)  # a pad of its own, as TRL's Llama reward test sets
    data = Dataset.from_list([{"prompt": "say ab"}])
    a = one_step_args(tmp_path)
    tr = GRPOTrainer(str(chat), reward_funcs=rm, args=a, train_dataset=data, reward_processing_classes=rtok)
    assert tr.reward_func_names == ["rm"] and tr.reward_processing_classes == [rtok]
    assert rm.config.pad_token_id == 3  # transformers reads the score at the last token before this pad
    with torch.no_grad():
        expected = rm(**rtok(["say abab"], return_tensors="pt")).logits[0, 0].item()
    assert tr.reward_funcs[0](["say ab"], ["ab"]) == [pytest.approx(expected, abs=1e-5)]  # text: prompt + completion
