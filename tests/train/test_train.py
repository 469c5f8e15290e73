"""The trainer end to end on a tiny local model: parameters move, the run folder is complete,
micro-batching equals the whole batch, bad configs stop with one sentence."""

import json

import pytest
import torch
import yaml

from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer
from helpers.runs import likes_a, make, tiny_cfg


def test_few_steps_change_every_parameter_and_write_run_folder(tiny_model_dir, tmp_path):
    tr = make(tiny_model_dir, tmp_path / "run", **{"algo.beta": 0.04})
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    summary = tr.train()
    for n, p in tr.model.named_parameters():
        assert not torch.equal(before[n], p.detach()), f"{n} did not change"
    for n, p in tr.ref_model.named_parameters():  # the reference stays frozen
        assert torch.equal(before[n], p.detach())
    run = tmp_path / "run"
    assert yaml.safe_load((run / "config.yaml").read_text())["rollout"]["group_size"] == 4
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    step_lines = [l for l in lines if "reward" in l]
    assert [l["step"] for l in step_lines] == [1, 2]
    for key in (
        "reward",
        "reward_std",
        "rewards/likes_a/mean",
        "frac_reward_zero_std",
        "advantages/std",
        "completions/mean_length",
        "completions/clipped_ratio",
        "kl",
        "entropy",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "grad_norm",
        "learning_rate",
        "time/rollout",
        "time/reward",
        "time/update",
        "tokens_per_second",
    ):
        assert key in step_lines[0], key
    assert summary["steps"] == 2 and "accuracy" in summary["eval_before"] and "accuracy" in summary["eval_after"]
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    ckpt = run / "checkpoints" / "step-000002" / "model"
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(ckpt)
    for (n, p), (_, q) in zip(tr.model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p, q), n


def test_micro_batches_give_the_same_update_as_the_whole_batch(tiny_model_dir, tmp_path, monkeypatch):
    import grpokit.train.update as U

    cuts = []
    real = U.micro_batches
    monkeypatch.setattr(U, "micro_batches", lambda *a: cuts.append(real(*a)) or cuts[-1])
    results = []
    for mbs, tokens in ((0, 0), (2, 0), (0, 24)):  # whole batch; 2 rows each; a budget of 24 tokens (uneven sizes)
        tr = make(
            tiny_model_dir,
            tmp_path / f"mb{mbs}-{tokens}",
            **{
                "train.micro_batch_size": mbs,
                "train.micro_batch_tokens": tokens,
                "train.steps": 1,
                "algo.aggregation": "token-mean",
                "train.deterministic": True,
                "optim.adam_eps": 1e-4,
            },
        )
        tr.train()
        results.append({n: p.detach().clone() for n, p in tr.model.named_parameters()})
    assert [len(c) for c in cuts] == [1, 4, len(cuts[2])] and len(cuts[2]) > 1
    # adam_eps 1e-4: with 1e-8, Adam's first step moves a weight by ~lr whatever its gradient's size,
    # turning summation-order noise in near-zero gradients into ~1e-6 differences
    for n in results[0]:
        assert torch.allclose(results[0][n], results[1][n], atol=1e-6), n
        assert torch.allclose(results[0][n], results[2][n], atol=1e-6), n


def test_micro_batches_cut_rows_in_order_by_rows_and_tokens():
    from grpokit.train.token_budget import micro_batches

    assert micro_batches([5, 5, 5, 9, 2], max_tokens=10) == [slice(0, 2), slice(2, 3), slice(3, 4), slice(4, 5)]
    assert micro_batches([5, 5, 5, 9, 2], max_tokens=11) == [slice(0, 2), slice(2, 3), slice(3, 5)]
    assert micro_batches([30, 1], max_tokens=10) == [slice(0, 1), slice(1, 2)]  # a long row goes alone
    assert micro_batches([1] * 5, max_rows=2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_batches([4, 4, 4, 4], max_rows=3, max_tokens=8) == [slice(0, 2), slice(2, 4)]
    assert micro_batches([3, 3], 0, 0) == [slice(0, 2)] and micro_batches([]) == []
    # balanced: two slices are needed either way; 12 tokens each instead of 20 + 4
    assert micro_batches([4] * 6, max_tokens=20) == [slice(0, 3), slice(3, 6)]
    assert micro_batches([4] * 6, max_tokens=24) == [slice(0, 6)]
    assert micro_batches([4] * 6, max_rows=2, max_tokens=100) == [slice(0, 2), slice(2, 4), slice(4, 6)]  # rows bind


def test_num_iterations_takes_old_logprobs_once(tiny_model_dir, tmp_path):
    tr = make(tiny_model_dir, tmp_path / "mu", **{"algo.num_iterations": 3, "train.steps": 1})
    m = tr.train_step()
    # three optimizer steps on one batch: by the third the ratio has moved away from 1
    assert m["ratio/mean"] != pytest.approx(1.0, abs=1e-7)
    assert tr.scheduler.last_epoch == 3


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.group_size=1", "rollout.group_size=1 is too small"),
        ("algo.aggregation=mean", "algo.aggregation='mean' is not valid; choose one of: seq-mean-token-mean"),
        ("algo.clip_low=1.5", "algo.clip_low=1.5 must be in [0, 1)"),
        ("train.micro_batch_size=3", "train.micro_batch_size=3 does not divide the batch"),
        ("algo.scale=median", "algo.scale='median' is not valid"),
        ("data.dataset=/no/such/file.jsonl", "data.dataset='/no/such/file.jsonl' does not exist"),
        ("model.name_or_path=/no/such/model", "model.name_or_path='/no/such/model' does not exist"),
        ("rollout.group_sise=4", "unknown config field 'rollout.group_sise'"),
    ],
)
def test_bad_config_gives_one_sentence(override, message, tmp_path):
    from grpokit.validation import validate

    with pytest.raises(ConfigError) as e:
        cfg = apply_overrides(Config(), [override])
        validate(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_dataset_column_is_named(tiny_model_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "ab", "answer": "a"}) + "\n")
    cfg = tiny_cfg(tiny_model_dir, tmp_path / "run")
    cfg.data.dataset = str(data)
    with pytest.raises(
        ConfigError, match="data.prompt_column='prompt' is not a column of .*its columns are: question, answer"
    ):
        Trainer(cfg, reward_funcs=[likes_a], quiet=True)


def test_token_budget_from_activation_memory_hand_example():
    from types import SimpleNamespace

    from grpokit.train.token_budget import token_budget

    cfg = SimpleNamespace(hidden_size=512, intermediate_size=1536, num_hidden_layers=8)
    # (10 * 512 + 4 * 1536) values x 8 layers x 4 bytes = 360,448 bytes a token; 512 MiB / that = 1489.4
    assert token_budget(cfg, 512, 4) == 1489
    assert token_budget(cfg, 512, 2) == 2978  # bfloat16 keeps twice as many
    assert token_budget(cfg, 512, 4, max_tokens=1000) == 1000  # the explicit cap wins when smaller
    assert token_budget(cfg, 0, 4, max_tokens=1000) == 1000 and token_budget(cfg, 0, 4) == 0
    assert token_budget(SimpleNamespace(), 512, 4, max_tokens=7) == 7  # unknown shape: no estimate


def test_activation_memory_auto_is_a_quarter_of_the_free_memory_of_the_device(monkeypatch):
    from types import SimpleNamespace

    import psutil

    from grpokit.train import token_budget
    from grpokit.train.token_budget import activation_memory_mb

    assert activation_memory_mb(0, torch.device("cpu")) == 0 and activation_memory_mb(300, torch.device("cuda")) == 300
    # CPU: a quarter of what the host has available (24 GB free -> 6 GB), never under 512 MB
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=24 * 2**30))
    assert activation_memory_mb(-1, torch.device("cpu")) == 6 * 1024
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=1 * 2**30))
    assert activation_memory_mb(-1, torch.device("cpu")) == 512
    monkeypatch.setattr(token_budget, "host_available_bytes", lambda: 0)  # unreadable: a fixed 512 MB
    assert activation_memory_mb(-1, torch.device("cpu")) == 512
    # CUDA: a quarter of the free memory (an 80 GiB card with 60 GiB free -> 15 GiB), not of the total
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (60 * 2**30, 80 * 2**30))
    assert activation_memory_mb(-1, torch.device("cuda")) == 15 * 1024


def test_host_available_bytes_reads_the_real_machine():
    from grpokit.train.token_budget import host_available_bytes

    assert 2**28 < host_available_bytes() < 2**50  # between 256 MB and 1 PB: a real reading, not 0


def test_dynamic_samplings_shortfall_is_warned_once_through_the_recorder(tiny_model_dir, tmp_path):
    """Every completion scores 1.0, so every group is flat: each of the 3 steps' rounds find 0 informative groups
    (< train.prompts_per_step=2). The shortfall is said once, at step 1, through the recorder: health.jsonl holds it
    as a note (before: the logging module's warning only, which health.jsonl, trackers and a quiet console never
    saw); dynamic_sampling/kept_groups counts every step."""
    cfg = tiny_cfg(
        tiny_model_dir,
        tmp_path / "run",
        **{"train.steps": 3, "algo.dynamic_sampling": "true", "algo.max_sampling_rounds": 2, "data.eval_size": 0},
    )
    cfg.data.dataset = ""
    rows = [{"prompt": p, "answer": "a"} for p in ("ab", "cd", "ef", "gh", "ij", "12", "34", "56")] * 2
    always_one = lambda prompts, completions, **kw: [1.0] * len(completions)  # noqa: E731
    Trainer(cfg, reward_funcs=[always_one], train_rows=rows, eval_rows=[], quiet=True).train()
    notes = [json.loads(line) for line in (tmp_path / "run" / "health.jsonl").read_text().splitlines()]
    notes = [n for n in notes if "dynamic sampling (algo.dynamic_sampling) found fewer" in n["message"]]
    assert [(n["step"], n["monitor"]) for n in notes] == [(1, "note")]
    assert notes[0]["message"].startswith(
        "dynamic sampling (algo.dynamic_sampling) found fewer than train.prompts_per_step=2 "
    )
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["dynamic_sampling/kept_groups"] for m in metrics] == [0.0, 0.0, 0.0]
