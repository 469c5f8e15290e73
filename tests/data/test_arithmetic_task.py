"""Tests for the built-in arithmetic task, its tokenizer, the shipped demo model and the evaluator."""

from __future__ import annotations

import json
import random

import pytest
import torch

from grpokit.data.tasks import get_task
from grpokit.data.tasks.arithmetic import (
    arithmetic_accuracy,
    extract_answer,
    format_prompt,
    held_out_pairs,
    held_out_rows,
    is_held_out,
    train_pairs,
    train_rows,
)
from grpokit.data.tasks.chartok import build_char_tokenizer
from grpokit.data.tasks.demo_model import (
    carry_free_sum,
    demo_model_path,
    has_carry,
    load_demo_model,
    teacher_completion,
)
from grpokit.data.tasks.evaluate import evaluate_accuracy, greedy_completions

# --- splits -------------------------------------------------------------------------------------


def test_splits_partition_all_pairs_and_are_disjoint():
    train, held = set(train_pairs()), set(held_out_pairs())
    assert not train & held
    assert len(train) + len(held) == 90 * 90  # operands 10..99 on both sides
    assert len(held) >= 200
    assert all(is_held_out(a, b) for a, b in held) and not any(is_held_out(a, b) for a, b in train)


def test_train_rows_never_contain_held_out_prompts_and_are_deterministic():
    held_prompts = {format_prompt(a, b) for a, b in held_out_pairs()}
    rows = train_rows(5000, seed=3)
    assert not {r["prompt"] for r in rows} & held_prompts
    assert rows == train_rows(5000, seed=3)
    assert rows[:10] == train_rows(10, seed=3)  # prefix-stable
    assert rows != train_rows(5000, seed=4)


def test_rows_format():
    rows = held_out_rows(250)
    assert len(rows) == 250 and len({r["prompt"] for r in rows}) == 250
    for r in rows:
        a, b = map(int, r["prompt"].rstrip("=").split("+"))
        assert r["answer"] == str(a + b)
    assert held_out_rows(5) == held_out_rows()[:5]


# --- extraction and reward ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>125</answer>", "125"),
        ("<answer> 125 </answer>", "125"),  # whitespace inside the tags is stripped
        ("junk<answer>7</answer>more", "7"),  # text outside the tags is ignored
        ("<answer>1</answer><answer>2</answer>", "1"),  # the first pair wins
        ("<answer>125", None),  # unclosed tag
        ("125", None),  # no tags at all
        ("", None),
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_reward_correct_wrong_malformed_missing_extra():
    completions = [
        "<answer>125</answer>",  # correct                     -> 1
        "<answer>115</answer>",  # wrong number                -> 0
        "<answer>125",  # malformed: no closing tag            -> 0
        "125",  # missing tags                                 -> 0
        "<answer>125</answer>5+5=",  # extra text after tags   -> 1 (only the tags are read)
        "<answer>0125</answer>",  # not canonical              -> 0
        [{"role": "assistant", "content": "<answer>125</answer>"}],  # conversational form -> 1
    ]
    rewards = arithmetic_accuracy(["57+68="] * 7, completions, answer=["125"] * 7)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]


def test_reward_needs_one_answer_per_completion():
    with pytest.raises(ValueError, match="one gold answer per completion"):
        arithmetic_accuracy(["1+1="], ["<answer>2</answer>"] * 2, answer=["2"])


# --- the forgetful teacher ----------------------------------------------------------------------


def test_carry_free_sum_hand_worked():
    # 57+68: tens (5+6) mod 10 = 1, units (7+8) mod 10 = 5 -> 15 (true sum 125)
    assert carry_free_sum(57, 68) == 15
    # 50+50: tens 10 mod 10 = 0, units 0 -> 0 (true sum 100)
    assert carry_free_sum(50, 50) == 0
    assert carry_free_sum(12, 34) == 46 and not has_carry(12, 34)
    # 19+13: units (9+3) mod 10 = 2, tens (1+1) mod 10 = 2 -> 22 (true sum 32, one carry)
    assert has_carry(19, 13) and carry_free_sum(19, 13) == 22
    # 95+10: tens (9+1) mod 10 = 0, units 5 -> 5 (true sum 105: the carry is out of the top column)
    assert has_carry(95, 10) and carry_free_sum(95, 10) == 5
    rng = random.Random(0)
    assert {teacher_completion(12, 34, rng) for _ in range(50)} == {"<answer>46</answer>"}
    assert {teacher_completion(57, 68, rng) for _ in range(50)} == {"<answer>125</answer>", "<answer>15</answer>"}


# --- tokenizer and shipped model ----------------------------------------------------------------


def test_tokenizer_round_trip_through_auto_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_model_path())
    text = "57+68=<answer>125</answer>"
    ids = tok(text)["input_ids"]
    # 6 prompt characters, 1 tag, 3 digits, 1 tag; no BOS, no unknowns
    assert len(ids) == 11 and tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
    assert tok.convert_ids_to_tokens(ids)[6] == "<answer>"
    assert tok.eos_token == "<eos>" and tok.pad_token == "<pad>"
    assert tok.get_vocab() == build_char_tokenizer().get_vocab()  # shipped = rebuilt
    config = json.loads((demo_model_path() / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # a name transformers 4 and 5 both load


def test_demo_model_loads_and_is_small():
    model, tok = load_demo_model()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tok)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weights <= 10 * 2**20
    files = sum(f.stat().st_size for f in demo_model_path().iterdir())
    assert files <= 10 * 2**20


# --- evaluator ----------------------------------------------------------------------------------


def test_evaluator_agrees_with_manual_greedy_decoding():
    torch.manual_seed(0)
    model, tok = load_demo_model()
    rows = held_out_rows(6)
    result = evaluate_accuracy(model, tok, rows, num_samples=6)
    assert result["n"] == 6 and 0.0 <= result["accuracy"] <= 1.0
    assert 1 <= result["mean_length"] <= 8
    # Manual check: argmax decoding one token at a time without cache, for the first two rows.
    for row, sample in zip(rows[:2], result["samples"][:2]):
        ids = tok(row["prompt"], return_tensors="pt")["input_ids"]
        for _ in range(8):
            with torch.no_grad():
                nxt = model(input_ids=ids).logits[0, -1].argmax()
            if nxt.item() == tok.eos_token_id:
                break
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        manual = tok.decode(ids[0, 6:])
        assert manual == sample["completion"]
        assert sample["reward"] == (1.0 if extract_answer(manual) == row["answer"] else 0.0)
    assert result["accuracy"] == sum(s["reward"] for s in result["samples"]) / 6


def test_greedy_completions_do_not_depend_on_batch_size():
    model, tok = load_demo_model()
    prompts = [r["prompt"] for r in held_out_rows(5)]
    one_by_one = greedy_completions(model, tok, prompts, batch_size=1)
    batched = greedy_completions(model, tok, prompts, batch_size=5)
    assert one_by_one == batched


def test_registry_entry():
    task = get_task("arithmetic")
    assert task.reward_fn is arithmetic_accuracy
    assert task.held_out_rows(3) == held_out_rows(3)
    assert task.recommended["group_size"] == 8
    from grpokit.config import ConfigError

    with pytest.raises(ConfigError, match="arithmetic"):
        get_task("nope")


def test_digit_steps_and_digit_accuracy_hand_worked():
    from grpokit.data.tasks.arithmetic_steps import digit_accuracy, digit_steps
    from grpokit.data.tasks.chartok import build_char_tokenizer

    tok = build_char_tokenizer()
    texts = ["<answer>115</answer>", "<answer>125</answer>", "12"]
    ids = [tok(t)["input_ids"] for t in texts]
    # gold 125. "115": tokens <answer> 1 1 5 </answer> -> digit steps at tokens 1, 2, 3 worth 1, 0, 1;
    # closing tag at token 4 worth 0 (answer wrong). "125": 1, 1, 1 and 1. "12": no tags -> one 0 step.
    steps = digit_steps(["57+68="] * 3, texts, ids, ["125"] * 3)
    assert steps == [[(1, 1.0), (2, 0.0), (3, 1.0), (4, 0.0)], [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0)], [(1, 0.0)]]
    assert digit_accuracy(["57+68="] * 3, texts, ids, ["125"] * 3) == pytest.approx([2 / 3, 1.0, 0.0])
