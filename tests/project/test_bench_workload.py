"""The benchmark's workload pieces: the analytic FLOP count (hand-worked) and the char tokenizer."""

import sys
from types import SimpleNamespace

from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from workload import build_model_dir, model_flops, reward_vowels  # noqa: E402

# h=4, 1 layer, V=10, I=8, 2 heads of dim 2, 1 kv head (kv width 2)
TINY = SimpleNamespace(
    hidden_size=4, num_hidden_layers=1, vocab_size=10, intermediate_size=8, num_attention_heads=2, num_key_value_heads=1
)


def test_model_flops_hand_worked():
    # TINY: weights per layer = q 16 + k,v 2*4*2 + o 16 + mlp 3*4*8 = 144; dense = 2*(144 + head 4*10) = 368 per token
    #   attention = 4 * layers * h = 16 per (query, key) pair
    #   prefill 2 tokens: 2*368 + 16*(1+2) = 784; decode 1 after them: 368 + 16*3 = 416; seq of 3: 3*368 + 16*6 = 1200
    f = model_flops(TINY, 2, 1)
    assert f == {"prefill": 784, "decode": 416}
    assert f["prefill"] + f["decode"] == 1200  # one forward over the 3 tokens


def test_a_groups_prompt_counts_once_in_every_phases_useful_flops():
    import worker

    clock = worker.PhaseClock()
    clock.lengths = [(2, 1), (2, 1), (2, 1), (2, 1)]  # 2 prompts x G=2, prompt 2 tokens, completion 1
    # per group: the prompt's 784 once, then 416 per completion (hand-worked above): 784 + 2 * 416 = 1616
    rec = worker._step_record(1.0, clock, TINY, SimpleNamespace(G=2, beta=0.04))
    assert rec["flops"] == {"rollout": 2 * 1616, "ref": 2 * 1616, "train": 3 * 2 * 1616}
    rec = worker._step_record(1.0, clock, TINY, SimpleNamespace(G=2, beta=0.0))
    assert rec["flops"]["ref"] == 0.0 and rec["prompts"] == 2


def test_model_dir_tokenizer_round_trips(tmp_path):
    from transformers import AutoTokenizer

    d = build_model_dir(tmp_path / "m", hidden=64, layers=1)
    tok = AutoTokenizer.from_pretrained(d)
    ids = tok("12+34=?")["input_ids"]
    assert tok.decode(ids) == "12+34=?" and tok.unk_token_id not in ids and len(tok) == 64


def test_reward_is_vowel_fraction():
    assert reward_vowels(None, ["abcd", "", "ae"]) == [0.25, 0.0, 1.0]
