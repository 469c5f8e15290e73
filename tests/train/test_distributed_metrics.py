"""Two gloo ranks log the metrics one process logs on the same global batch: every metric by its rule over ranks
(record/rank_reduction.py), the reward statistics, "solved" and the domains over every rank's rows; the job's
throughput; and a rank's failure named in summary.json, the doctor and the command line.

Sampling is scripted (helpers/distributed.py), so the global batch is the same on any rank layout.
"""

import json
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpokit.train import Trainer
from helpers.distributed import OVER, scripted_generate
from helpers.runs import tiny_cfg

VOLATILE = ("time/", "tokens_per_second", "rollout/tokens_per_second", "gpu/")
ROWS = [
    {"prompt": p, "answer": "a", "domain": "letters" if p.isalpha() else "digits"}
    for p in ("ab", "cd", "ef", "gh", "12", "34", "56", "78")
]


def letters_only(prompts, completions, **kwargs):
    """1 for a letter prompt, 0 for a digit one, and a failure (not a number) for an even-length completion of a
    digit prompt: ranks then hold different numbers of scored completions, and a rank whose groups are all digit
    prompts has a best reward of 0."""
    return [1.0 if p.isalpha() else "no" if len(c) % 2 == 0 else 0.0 for p, c in zip(prompts, completions)]


def fails_on_rank_1(prompts, completions, **kwargs):
    if dist.is_initialized() and dist.get_rank() == 1 and kwargs["trainer_state"].global_step == 1:
        raise RuntimeError("rank 1's verifier broke")
    return [1.0] * len(completions)


def run(model_dir, out, reward, **over):
    import grpokit.rollout.engine as engine  # the hf engine samples with its module's generate

    real, engine.generate = engine.generate, scripted_generate
    try:
        cfg = tiny_cfg(model_dir, out, **{**OVER, "train.steps": 3, "reward.max_failure_fraction": 0.9, **over})
        cfg.data.dataset = ""
        Trainer(cfg, reward_funcs=[reward], train_rows=ROWS, quiet=True).train()
    finally:
        engine.generate = real


def _worker(rank, world, init_file, model_dir, out, reward):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        run(model_dir, out, reward)
    finally:
        dist.destroy_process_group()


def spawn(tmp_path, model_dir, out, reward):
    """Two ranks, each waited for to its end (mp.spawn's join would end rank 0 as soon as rank 1 fails)."""
    ctx = mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(model_dir), out, reward), nprocs=2, join=False)
    for p in ctx.processes:
        p.join(300)
    return [p.exitcode for p in ctx.processes]


def lines(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]


@pytest.mark.slow
def test_two_ranks_log_every_metric_one_process_logs(tiny_model_dir, tmp_path):
    assert spawn(tmp_path, tiny_model_dir, tmp_path / "two", letters_only) == [0, 0]
    run(tiny_model_dir, tmp_path / "one", letters_only)
    one, two = lines(tmp_path / "one"), lines(tmp_path / "two")
    assert len(one) == len(two) == 3
    assert sum(m["rewards/letters_only/failures"] for m in one) > 0  # the failures the statistics leave out
    assert any(0 < m["completions/frac_groups_solved"] < 1 for m in one)  # solved: letters, not digits
    assert any(k.startswith("domain/digits/") for k in one[0])
    for step, (a, b) in enumerate(zip(one, two), 1):
        assert a.keys() == b.keys(), (step, a.keys() ^ b.keys())
        for key in a:
            if not key.startswith(VOLATILE):
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (step, key, a[key], b[key])
        # the job's throughput: every rank's tokens (16 completions) over the step's seconds
        tokens = b["completions/mean_length"] * 16
        assert b["tokens_per_second"] * b["time/step"] == pytest.approx(tokens, rel=0.05), step


@pytest.mark.slow
def test_a_failing_rank_is_named_in_the_summary_and_by_the_doctor(tiny_model_dir, tmp_path):
    from grpokit.record.doctor import diagnose
    from grpokit.record.report_data import load_run

    out = tmp_path / "two"
    codes = spawn(tmp_path, tiny_model_dir, out, fails_on_rank_1)
    assert codes[0] != 0 and codes[1] != 0
    failed = json.loads((out / "summary.json").read_text())["failed"]
    assert failed["rank"] == 1 and failed["step"] == 1
    assert "rank 1's verifier broke" in failed["error"] and "RewardError" in failed["error"]
    assert "RuntimeError" in failed["rank_0_saw"]  # what rank 0 itself saw: the collective broken under it
    record = json.loads((out / "failed-rank1.json").read_text())
    assert record["error"] == failed["error"] and record["collective"] is False
    finding = next(f for f in diagnose(load_run(out)) if f.code == "run_failed")
    assert "on rank 1" in finding.evidence and "rank 1's verifier broke" in finding.evidence
